package api

import (
	"bytes"
	"encoding/json"
)

// refCheckFieldNames is checkFieldNames as it was before decodeSubmit checked a walked body's
// request alone and checkMember ruled names out by their length (0858888), kept as the reference
// of FuzzScanSubmit: every body's answer must be its answer.
func refCheckFieldNames(body []byte) error {
	s := jsonScanner{b: body}
	if s.peek() != '{' {
		return nil
	}
	return s.refCheckObject(envelopeFields)
}

// refCheckObject checks the names of the object at the scanner against spec and passes over it.
func (s *jsonScanner) refCheckObject(spec *fieldSpec) error {
	var seen uint64 // bit i: spec.names[i]
	s.i++           // {
	for {
		switch s.peek() {
		case 0:
			return nil
		case '}':
			s.i++
			return nil
		case ',':
			s.i++
			continue
		}
		raw := s.str()
		if len(raw) < 2 {
			return nil // not valid JSON: decodeSubmit has refused it
		}
		name, escaped := raw[1:len(raw)-1], false
		if bytes.IndexByte(name, '\\') >= 0 {
			var decoded string
			_ = json.Unmarshal(raw, &decoded) // valid JSON: the escapes decode
			name, escaped = []byte(decoded), true
		}
		s.peek()
		s.i++ // :
		if err := s.refCheckMember(spec, &seen, name, escaped); err != nil {
			return err
		}
	}
}

// refCheckMember checks one member's name (decoded; escaped when written with an escape) and
// passes over its value, checking the objects under it that spec names.
func (s *jsonScanner) refCheckMember(spec *fieldSpec, seen *uint64, name []byte, escaped bool) error {
	known := false
	for i, want := range spec.names {
		if !bytes.EqualFold(name, []byte(want)) {
			continue
		}
		exact := string(name) == want
		switch {
		case !exact && spec.closed:
			return invalid("unknown_field", "unknown field %s: field names are case-sensitive (did you mean %q?)", s.quotedPath(name), want)
		case !exact:
			return invalid(spec.typ, "field %s must be spelled %q: the provider reads field names exactly, and so does llmq", s.quotedPath(name), want)
		case escaped && !spec.closed:
			return invalid(spec.typ, "field %s must be spelled %q, without escapes: llmq reads it as written", s.quotedPath(name), want)
		case *seen&(1<<i) != 0:
			return invalid(spec.typ, "field %s appears twice: send it once", s.quotedPath(name))
		}
		*seen |= 1 << i
		known = true
	}
	if spec.closed && !known {
		// decodeSubmit refuses other unknown names; a name it took in another case (Unicode
		// folding) ends here.
		return invalid("unknown_field", "unknown field %s", s.quotedPath(name))
	}
	child := spec.in[string(name)]
	switch {
	case child == nil:
		s.skip()
	case s.peek() == '{':
		s.push(name, -1)
		defer s.pop()
		return s.refCheckObject(child)
	case s.peek() == '[':
		s.i++ // [
		for i := 0; ; {
			switch s.peek() {
			case 0:
				return nil
			case ']':
				s.i++
				return nil
			case ',':
				s.i++
				continue
			case '{':
				s.push(name, i)
				err := s.refCheckObject(child)
				s.pop()
				if err != nil {
					return err
				}
			default:
				s.skip()
			}
			i++
		}
	default:
		s.skip()
	}
	return nil
}
