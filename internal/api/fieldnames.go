package api

import (
	"bytes"
	"encoding/json"
	"reflect"
	"strconv"
	"strings"
)

// Field names match exactly. Go's encoding/json, which decodes the submit body and reads the fields
// of the request that llmq uses (deltastream.Requested: stream; tokens.Count: model, max_tokens, n,
// tools, response_format, the messages' text, tool calls, documents and images), matches a name
// in any case, Unicode folding included ("ſtream" is "stream" to it), and keeps the last of a name
// sent twice; a provider matches names exactly.
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
	// children is in by index: children[i] is in[names[i]], nil when it has none (set by
	// indexChildren: a lookup by index, where in's was a tenth of a check's time).
	children []*fieldSpec
}

// indexChildren sets the children of spec and of the specs under it, and returns spec.
func indexChildren(spec *fieldSpec) *fieldSpec {
	if spec.in == nil || spec.children != nil {
		return spec
	}
	spec.children = make([]*fieldSpec, len(spec.names))
	for i, name := range spec.names {
		if child := spec.in[name]; child != nil {
			spec.children[i] = indexChildren(child)
		}
	}
	return spec
}

// blockFields are the names tokens.Count reads in a content block: its type, its text, a
// tool_result's content, whose blocks it reads as resultBlockFields, a tool_use's input, a
// document's or an image's source (sourceFields), and an OpenAI image part's image_url
// (imageURLFields).
var blockFields = &fieldSpec{
	names: []string{"type", "text", "content", "input", "source", "image_url"},
	in: map[string]*fieldSpec{"content": resultBlockFields, "source": sourceFields,
		"image_url": imageURLFields},
	typ: "invalid_request"}

// imageURLFields are the names tokens.Count reads in an OpenAI image part's image_url: the url
// (a base64 data URL's image size) and the detail.
var imageURLFields = &fieldSpec{names: []string{"url", "detail"}, typ: "invalid_request"}

// sourceFields are the names tokens.Count reads in a document's or an image's source: its type, a
// text source's data or a base64 image's, and a content source's blocks (resultBlockFields).
var sourceFields = &fieldSpec{names: []string{"type", "data", "content"},
	in: map[string]*fieldSpec{"content": resultBlockFields}, typ: "invalid_request"}

// resultBlockFields are the names tokens.Count reads in a block of a tool_result's content or of a
// document's content source: as a content block's, but a source there has no content it reads.
var resultBlockFields = &fieldSpec{names: []string{"type", "text", "input", "source"},
	in: map[string]*fieldSpec{"source": resultSourceFields}, typ: "invalid_request"}

// resultSourceFields are the names tokens.Count reads in a source inside resultBlockFields.
var resultSourceFields = &fieldSpec{names: []string{"type", "data"}, typ: "invalid_request"}

// toolCallFields are the names tokens.Count reads in an OpenAI assistant message's tool call.
var toolCallFields = &fieldSpec{names: []string{"function"},
	in:  map[string]*fieldSpec{"function": {names: []string{"name", "arguments"}, typ: "invalid_request"}},
	typ: "invalid_request"}

// requestFields are the names llmq reads in the provider-native request, in either dialect:
// deltastream.Requested and llm's Send (stream, stream_options), tokens.Count (model, messages'
// content and tool_calls, system, tools, max_tokens, max_completion_tokens, OpenAI's n and
// response_format's json_schema).
var requestFields = &fieldSpec{
	names: []string{"model", "messages", "system", "tools", "max_tokens", "max_completion_tokens", "n",
		"stream", "stream_options", "response_format"},
	in: map[string]*fieldSpec{
		"messages": {names: []string{"content", "tool_calls"},
			in: map[string]*fieldSpec{"content": blockFields, "tool_calls": toolCallFields}, typ: "invalid_request"},
		"system":          blockFields,
		"response_format": {names: []string{"json_schema"}, typ: "invalid_request"},
	},
	typ: "invalid_request",
}

// envelopeFields is the submit body: submitBody's fields, and nothing else.
var envelopeFields = indexChildren(&fieldSpec{names: jsonNames(reflect.TypeFor[submitBody]()),
	closed: true, in: map[string]*fieldSpec{"request": requestFields}, typ: "invalid_field"})

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
// contract's, or a name of the request that llmq reads spelled in another case, written with an
// escape ("\u0073tream", which readers of raw bytes would miss) or sent twice,
// naming it; envelope names are unknown_field and invalid_field, the request's invalid_request.
// It runs on every submit body the walk (scanSubmit) does not take, checkRequestNames on the
// others: each allocates nothing but its error (TestCheckFieldNames_AllocationFree).
func checkFieldNames(body []byte) error {
	s := jsonScanner{b: body}
	if s.peek() != '{' {
		return nil // decodeSubmit has refused it
	}
	return s.checkObject(envelopeFields)
}

// requestName is the envelope's name of the request, the first step of its names' paths.
var requestName = []byte("request")

// checkRequestNames is checkFieldNames's answer for a body whose envelope names are the
// contract's, each spelled exactly, without escapes, and sent once (scanSubmit took it): the
// check of request, the value of its "request" member (nil when it has none), alone.
func checkRequestNames(request []byte) error {
	if len(request) == 0 {
		return nil
	}
	s := jsonScanner{b: request}
	var seen uint64
	return s.checkMember(envelopeFields, &seen, requestName, false)
}

// checkObject checks the names of the object at the scanner against spec and passes over it.
func (s *jsonScanner) checkObject(spec *fieldSpec) error {
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
		raw, escaped := s.key()
		if len(raw) < 2 {
			return nil // not valid JSON: decodeSubmit has refused it
		}
		name := raw[1 : len(raw)-1]
		if escaped {
			var decoded string
			_ = json.Unmarshal(raw, &decoded) // valid JSON: the escapes decode
			name = []byte(decoded)
		}
		s.peek()
		s.i++ // :
		if err := s.checkMember(spec, &seen, name, escaped); err != nil {
			return err
		}
	}
}

// checkMember checks one member's name (decoded; escaped when written with an escape) and
// passes over its value, checking the objects under it that spec names.
func (s *jsonScanner) checkMember(spec *fieldSpec, seen *uint64, name []byte, escaped bool) error {
	known := -1 // the index in spec.names of the name, spelled exactly
	for i, want := range spec.names {
		if string(name) == want {
			known = i
			break
		}
	}
	if known < 0 {
		// A name folding to one of spec.names without being it is refused: the names are ASCII,
		// lower case and distinct (TestFieldSpecs_LowerCase), so that a name spelled exactly as
		// one folds to no other, and only a name matching none exactly needs EqualFold.
		if i := foldedName(spec, name); i >= 0 {
			path, want := s.quotedPath(name), spec.names[i]
			if spec.closed {
				return invalid("unknown_field",
					"unknown field %s: field names are case-sensitive (did you mean %q?)", path, want)
			}
			return invalid(spec.typ, "field %s must be spelled %q: the provider reads field names "+
				"exactly, and so does llmq", path, want)
		}
		if spec.closed {
			// decodeSubmit refuses other unknown names; a name it took in another case (Unicode
			// folding) ends here.
			return invalid("unknown_field", "unknown field %s", s.quotedPath(name))
		}
		s.skip()
		return nil
	}
	switch {
	case escaped && !spec.closed:
		return invalid(spec.typ, "field %s must be spelled %q, without escapes: llmq reads it as "+
			"written", s.quotedPath(name), spec.names[known])
	case *seen&(1<<known) != 0:
		return invalid(spec.typ, "field %s appears twice: send it once", s.quotedPath(name))
	}
	*seen |= 1 << known
	var child *fieldSpec
	if known < len(spec.children) {
		child = spec.children[known]
	}
	switch {
	case child == nil:
		s.skip()
	case s.peek() == '{':
		s.push(name, -1)
		err := s.checkObject(child)
		s.pop()
		return err
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
				err := s.checkObject(child)
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

// foldedName is the index in spec.names of the first name that name, spelled otherwise, folds to
// (bytes.EqualFold), -1 when it folds to none.
func foldedName(spec *fieldSpec, name []byte) int {
	ascii := isASCII(name)
	for i, want := range spec.names {
		// want is ASCII: a name folding to it has a rune for each of its bytes, of one byte
		// when ASCII, of more otherwise (the Kelvin sign, the long s), so it is no shorter, and
		// as long only when ASCII. The lengths rule most names out before EqualFold's loop.
		if len(name) < len(want) || len(name) > len(want) && ascii || !bytes.EqualFold(name, []byte(want)) {
			continue
		}
		return i
	}
	return -1
}

// literalEnd is the index of the first byte from b[i] that ends a number or a literal: white
// space, a comma, a colon or a closing bracket (len(b) at the end).
func literalEnd(b []byte, i int) int {
	for ; i < len(b); i++ {
		switch b[i] {
		case ' ', '\t', '\r', '\n', ',', ':', ']', '}':
			return i
		}
	}
	return i
}

// isASCII reports whether b is ASCII only.
func isASCII(b []byte) bool {
	for _, c := range b {
		if c >= 0x80 {
			return false
		}
	}
	return true
}

// pathStep is one step from the body to an object being checked: a name, and an index in its
// value when an array (-1 when not).
type pathStep struct {
	name  []byte
	index int
}

// push adds a step to the path. The specs nest at most len(path) objects deep
// (TestFieldSpecs_FitPath), so the path never fills.
func (s *jsonScanner) push(name []byte, index int) {
	s.path[s.depth] = pathStep{name: name, index: index}
	s.depth++
}

func (s *jsonScanner) pop() { s.depth-- }

// quotedPath returns the place of name in the body, quoted, for an error message
// ("request.messages[1].Content").
func (s *jsonScanner) quotedPath(name []byte) string {
	var b strings.Builder
	for _, p := range s.path[:s.depth] {
		b.Write(p.name)
		if p.index >= 0 {
			b.WriteString("[" + strconv.Itoa(p.index) + "]")
		}
		b.WriteByte('.')
	}
	b.Write(name)
	return strconv.Quote(b.String())
}

// jsonScanner walks a JSON document known to be valid, without decoding what it skips. It
// compares names where they lie in the document and keeps its path in a fixed array (the checked
// objects lie at most six deep: a source in a document's content source): a check allocates
// nothing, the scanner included (it stays on the stack: it holds no pointer to itself, as a
// slice of an array of its own would be).
type jsonScanner struct {
	b     []byte
	i     int
	path  [6]pathStep
	depth int // steps of path in use
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

// key passes over the string at the scanner, a member's name, and returns it, quotes included,
// and whether it holds an escape: as str, but byte by byte, which for a name (a few bytes) is
// faster than calls to bytes.IndexByte (str's, and one looking for a backslash: half of a check's
// time when names were read so).
func (s *jsonScanner) key() (raw []byte, escaped bool) {
	start := s.i
	for s.i++; s.i < len(s.b); s.i++ {
		switch s.b[s.i] {
		case '\\':
			s.i++ // the escaped byte
			escaped = true
		case '"':
			s.i++
			return s.b[start:s.i], escaped
		}
	}
	s.i = len(s.b)
	return s.b[start:], escaped
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
			s.i = literalEnd(s.b, s.i)
		}
		if depth <= 0 {
			return
		}
	}
}
