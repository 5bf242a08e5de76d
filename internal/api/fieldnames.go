package api

import (
	"bytes"
	"encoding/json"
	"reflect"
	"strconv"
	"strings"
)

// Field names match exactly. Go's encoding/json, which decodes the submit body and reads the
// fields of the request that llmq uses (deltastream.Requested: stream; tokens.Count: model,
// max_tokens, the messages' text), matches a name in any case, Unicode folding included ("ſtream"
// is "stream" to it), and keeps the last of a name sent twice; a provider matches names exactly.
// llmq's view of a request (streaming or not, the tokens the limiter reserves, the model) must be
// the provider's, so such names are refused at submit (checkFieldNames) rather than read.

// fieldSpec is the names llmq reads in one JSON object.
type fieldSpec struct {
	// names are read exactly as spelled: one spelled in another case, or sent twice, is refused.
	names []string
	// closed refuses any other name (the envelope: the contract's fields only).
	closed bool
	// in holds the specs of objects under a name: its value when an object, or each object of
	// its value when an array.
	in map[string]*fieldSpec
	// typ is the error type of a refusal in this object.
	typ string
}

// blockFields are the names tokens.Count reads in a content block.
var blockFields = &fieldSpec{names: []string{"type", "text"}, typ: "invalid_request"}

// requestFields are the names llmq reads in the provider-native request, in either dialect:
// deltastream.Requested and llm's Send (stream, stream_options), tokens.Count (model, messages'
// content, system, max_tokens, max_completion_tokens).
var requestFields = &fieldSpec{
	names: []string{"model", "messages", "system", "max_tokens", "max_completion_tokens", "stream", "stream_options"},
	in: map[string]*fieldSpec{
		"messages": {names: []string{"content"}, in: map[string]*fieldSpec{"content": blockFields}, typ: "invalid_request"},
		"system":   blockFields,
	},
	typ: "invalid_request",
}

// envelopeFields is the submit body: submitBody's fields, and nothing else.
var envelopeFields = &fieldSpec{names: jsonNames(reflect.TypeFor[submitBody]()), closed: true,
	in: map[string]*fieldSpec{"request": requestFields}, typ: "invalid_field"}

// jsonNames returns the JSON names of a struct's fields.
func jsonNames(t reflect.Type) []string {
	var names []string
	for i := range t.NumField() {
		name, _, _ := strings.Cut(t.Field(i).Tag.Get("json"), ",")
		names = append(names, name)
	}
	return names
}

// checkFieldNames refuses a submit body (valid JSON) with a name spelled otherwise than the
// contract's, or a name of the request that llmq reads spelled in another case or sent twice,
// naming it; envelope names are unknown_field and invalid_field, the request's invalid_request.
func checkFieldNames(body []byte) error {
	s := &jsonScanner{b: body}
	if s.peek() != '{' {
		return nil // decodeSubmit has refused it
	}
	return s.checkObject(envelopeFields, func() string { return "" })
}

// checkObject checks the names of the object at the scanner against spec; path is its place in
// the body, for the error message ("" for the body, else ending with a dot).
func (s *jsonScanner) checkObject(spec *fieldSpec, path func() string) error {
	var seen uint64 // bit i: spec.names[i]
	return s.object(func(name string) error {
		known := false
		for i, want := range spec.names {
			if !strings.EqualFold(name, want) {
				continue
			}
			switch {
			case name != want && spec.closed:
				return invalid("unknown_field", "unknown field %s: field names are case-sensitive (did you mean %q?)", strconv.Quote(path()+name), want)
			case name != want:
				return invalid(spec.typ, "field %s must be spelled %q: the provider reads field names exactly, and so does llmq", strconv.Quote(path()+name), want)
			case seen&(1<<i) != 0:
				return invalid(spec.typ, "field %s appears twice: send it once", strconv.Quote(path()+name))
			}
			seen |= 1 << i
			known = true
		}
		if spec.closed && !known {
			// decodeSubmit refuses other unknown names; a name it took in another case (Unicode
			// folding) ends here.
			return invalid("unknown_field", "unknown field %s", strconv.Quote(path()+name))
		}
		child := spec.in[name]
		switch {
		case child == nil:
			s.skip()
			return nil
		case s.peek() == '{':
			return s.checkObject(child, func() string { return path() + name + "." })
		case s.peek() == '[':
			return s.array(func(i int) error {
				if s.peek() != '{' {
					s.skip()
					return nil
				}
				return s.checkObject(child, func() string { return path() + name + "[" + strconv.Itoa(i) + "]." })
			})
		default:
			s.skip()
			return nil
		}
	})
}

// jsonScanner walks a JSON document known to be valid, without decoding what it skips.
type jsonScanner struct {
	b []byte
	i int
}

// peek returns the next byte that is not white space (0 at the end).
func (s *jsonScanner) peek() byte {
	for s.i < len(s.b) {
		switch c := s.b[s.i]; c {
		case ' ', '\t', '\r', '\n':
			s.i++
		default:
			return c
		}
	}
	return 0
}

// str passes over the string at the scanner and returns it, quotes included. It looks for
// quotes (bytes.IndexByte is vectorised) and skips those escaped, after an odd run of
// backslashes, rather than reading the string byte by byte.
func (s *jsonScanner) str() []byte {
	start := s.i
	for s.i++; ; {
		q := bytes.IndexByte(s.b[s.i:], '"')
		if q < 0 {
			s.i = len(s.b)
			return s.b[start:]
		}
		s.i += q + 1
		escapes := 0
		for j := s.i - 2; j > start && s.b[j] == '\\'; j-- {
			escapes++
		}
		if escapes%2 == 0 {
			return s.b[start:s.i]
		}
	}
}

// skip passes over one value, however deep, without recursion.
func (s *jsonScanner) skip() {
	depth := 0
	for {
		switch c := s.peek(); c {
		case 0:
			return
		case '"':
			s.str()
		case '{', '[':
			depth++
			s.i++
		case '}', ']':
			depth--
			s.i++
		case ',', ':':
			s.i++
		default: // a number, true, false or null
			for s.i < len(s.b) && !strings.ContainsRune(" \t\r\n,:]}", rune(s.b[s.i])) {
				s.i++
			}
		}
		if depth <= 0 {
			return
		}
	}
}

// object passes over the object at the scanner, calling f with each member's name (decoded)
// when the scanner is at its value; f must pass over the value. It stops at f's first error.
func (s *jsonScanner) object(f func(name string) error) error {
	s.peek()
	s.i++ // {
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
		name := string(raw[1 : len(raw)-1])
		if strings.IndexByte(name, '\\') >= 0 {
			_ = json.Unmarshal(raw, &name) // valid JSON: the escapes decode
		}
		s.peek()
		s.i++ // :
		if err := f(name); err != nil {
			return err
		}
	}
}

// array passes over the array at the scanner, calling f with each element's index when the
// scanner is at it; f must pass over the element. It stops at f's first error.
func (s *jsonScanner) array(f func(i int) error) error {
	s.peek()
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
		}
		if err := f(i); err != nil {
			return err
		}
		i++
	}
}
