package idem

import (
	"bytes"
	"slices"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/llmq/llmq/internal/jsonscan"
)

// canonicalMaxDepth is the nesting of arrays and objects appendCanonical writes; a document
// nested deeper is left to canonicalJSON (whose decoder refuses past 10000).
const canonicalMaxDepth = 512

// canonicalCopies bounds the bytes appendCanonical copies to order objects' members, in lengths
// of the document: the usual document, a few objects deep, copies each byte a few times; one
// nesting large members 512 deep would copy them 512 times (seconds for a 4 MiB body), and is
// left to canonicalJSON, linear in it.
const canonicalCopies = 16

// appendCanonical appends to dst (nil: to the writer's own space, see canonWriter) the canonical
// form of doc, byte for byte what canonicalJSON writes (encoding/json's decoder into any with
// UseNumber, then its encoder without HTML escaping), walking doc once without decoding it into
// values: ok is false, and dst meaningless, when doc is not one valid JSON value with white space
// around it or is nested deeper than canonicalMaxDepth, or when ordering its objects' members
// would copy more than canonicalCopies times its length (large members nested in many objects:
// each object whose keys are out of order copies its members once more, where encoding/json's
// encoder writes each byte once); the caller then asks canonicalJSON, whose error is the answer.
// The rules kept: object keys sorted by their decoded bytes, a repeated key's last value kept,
// numbers as written, strings decoded (an invalid escape pair or byte as U+FFFD) and re-escaped
// as encoding/json's encoder escapes them.
func appendCanonical(dst, doc []byte) (out []byte, ok bool) {
	c := newCanonWriter(doc)
	if dst != nil {
		c.out = dst
	}
	i := jsonscan.SkipSpace(doc, 0)
	end := c.value(i, 0)
	if end < 0 || jsonscan.SkipSpace(doc, end) != len(doc) {
		return dst, false
	}
	return c.out, true
}

// canonWriter is appendCanonical's walk: out is the form written so far; members and keys (the
// keys written with escapes, decoded) are the members of the objects being written, outermost
// first (stacks shared by the nested objects, so that a document allocates them once); tmp is
// scratch space to order an object's members in, and to decode a string value in; copies is
// what is left of the bytes the walk may copy to order members (canonicalCopies).
type canonWriter struct {
	doc, out, tmp []byte
	members       []canonMember
	keys          []byte
	copies        int

	// memberSpace and byteSpace are where members, out and tmp start, in the writer's own
	// allocation: the usual document's walk allocates once, where it allocated the three apart
	// (TestFingerprint_Allocs). An answer written in byteSpace holds the writer with it.
	memberSpace [16]canonMember
	byteSpace   [canonSpace]byte
}

// canonSpace is the bytes of out and tmp (half each) in a canonWriter's allocation: a document of
// up to half of it (bench/'s submit body is 150 bytes) needs no other; a larger one allocates
// both in one more.
const canonSpace = 1 << 9

// newCanonWriter returns a writer of doc's canonical form, out and tmp with len(doc) bytes each
// (a canonical form is no longer than its document but for the escapes it adds).
func newCanonWriter(doc []byte) *canonWriter {
	c := &canonWriter{doc: doc, copies: canonicalCopies * len(doc)}
	c.members = c.memberSpace[:0]
	space := c.byteSpace[:]
	if 2*len(doc) > len(space) {
		space = make([]byte, 2*len(doc))
	}
	half := len(space) / 2
	c.out, c.tmp = space[:0:half], space[half:half]
	return c
}

// canonMember is one member of an object being written: its key decoded (keys[keyStart:keyEnd],
// or doc's bytes when written without escapes) and its form `"key":value`, out[start:end].
type canonMember struct {
	key        []byte
	start, end int
}

// value writes the canonical form of the JSON value at doc[i], depth arrays and objects deep,
// and returns the index just past it in doc, -1 when doc holds no valid value there (or one too
// deep).
func (c *canonWriter) value(i, depth int) int {
	if i >= len(c.doc) {
		return -1
	}
	switch b := c.doc[i]; {
	case b == '"':
		end, _ := c.str(i, false)
		return end
	case b == '{':
		if depth >= canonicalMaxDepth {
			return -1
		}
		return c.object(i, depth)
	case b == '[':
		if depth >= canonicalMaxDepth {
			return -1
		}
		c.out = append(c.out, '[')
		i = jsonscan.SkipSpace(c.doc, i+1)
		if i < len(c.doc) && c.doc[i] == ']' {
			c.out = append(c.out, ']')
			return i + 1
		}
		for {
			if i = c.value(i, depth+1); i < 0 {
				return -1
			}
			if i = jsonscan.SkipSpace(c.doc, i); i >= len(c.doc) {
				return -1
			}
			switch c.doc[i] {
			case ',':
				c.out = append(c.out, ',')
				i = jsonscan.SkipSpace(c.doc, i+1)
			case ']':
				c.out = append(c.out, ']')
				return i + 1
			default:
				return -1
			}
		}
	default: // a number or a literal, written as it is
		end := jsonscan.Value(c.doc, i)
		if end < 0 {
			return -1
		}
		c.out = append(c.out, c.doc[i:end]...)
		return end
	}
}

// object writes the canonical form of the object at doc[i] (see value). Its members are written
// as they come, separated by commas: an object whose keys come in order, each once, is then
// written; any other is ordered in tmp and copied back.
func (c *canonWriter) object(i, depth int) int {
	base, keysBase, start := len(c.members), len(c.keys), len(c.out)
	defer func() { c.members, c.keys = c.members[:base], c.keys[:keysBase] }()
	c.out = append(c.out, '{')
	i = jsonscan.SkipSpace(c.doc, i+1)
	if i < len(c.doc) && c.doc[i] == '}' {
		c.out = append(c.out, '}')
		return i + 1
	}
	sorted := true
	for {
		if i >= len(c.doc) || c.doc[i] != '"' {
			return -1
		}
		if len(c.members) > base {
			c.out = append(c.out, ',')
		}
		m := canonMember{start: len(c.out)}
		if i, m.key = c.str(i, true); i < 0 {
			return -1
		}
		if i = jsonscan.SkipSpace(c.doc, i); i >= len(c.doc) || c.doc[i] != ':' {
			return -1
		}
		c.out = append(c.out, ':')
		if i = c.value(jsonscan.SkipSpace(c.doc, i+1), depth+1); i < 0 {
			return -1
		}
		m.end = len(c.out)
		if n := len(c.members); n > base && bytes.Compare(c.members[n-1].key, m.key) >= 0 {
			sorted = false
		}
		c.members = append(c.members, m)
		if i = jsonscan.SkipSpace(c.doc, i); i >= len(c.doc) {
			return -1
		}
		switch c.doc[i] {
		case ',':
			i = jsonscan.SkipSpace(c.doc, i+1)
			continue
		case '}':
			i++
		default:
			return -1
		}
		break
	}
	if sorted { // keys in order, none repeated: the members written are the form
		c.out = append(c.out, '}')
		return i
	}
	if c.copies -= len(c.out) - start; c.copies < 0 {
		return -1 // see canonicalCopies
	}
	members := c.members[base:]
	sortMembers(members)
	c.tmp = append(c.tmp[:0], '{')
	for k, m := range members {
		if k+1 < len(members) && bytes.Equal(m.key, members[k+1].key) {
			continue // a repeated key: the last one's value is kept
		}
		if len(c.tmp) > 1 {
			c.tmp = append(c.tmp, ',')
		}
		c.tmp = append(c.tmp, c.out[m.start:m.end]...)
	}
	c.tmp = append(c.tmp, '}')
	c.out = append(c.out[:start], c.tmp...)
	return i
}

// sortMembers sorts members by key, equal keys in the document's order (stable): the last of a
// run is the value encoding/json's decoder kept. An object of a few members is sorted by
// insertion, without slices.SortStableFunc's calls of a comparison function (most of the
// 0.9 k instructions ordering took for the usual document), a larger one by it.
func sortMembers(members []canonMember) {
	if len(members) > insertionSortMax {
		slices.SortStableFunc(members, func(a, b canonMember) int { return bytes.Compare(a.key, b.key) })
		return
	}
	for k := 1; k < len(members); k++ {
		for j := k; j > 0 && bytes.Compare(members[j-1].key, members[j].key) > 0; j-- {
			members[j-1], members[j] = members[j], members[j-1]
		}
	}
}

// insertionSortMax is the most members sortMembers sorts by insertion (quadratic): past it,
// slices.SortStableFunc, which sorts by insertion too up to 20.
const insertionSortMax = 16

// str writes the canonical form of the string at doc[i] and returns the index just past it (-1
// when it is not a valid JSON string) and, for a key, its decoded bytes: doc's when it has no
// escape and is UTF-8, else bytes of keys, valid until the object holding it is written. A
// value's escapes are decoded in tmp, which the object holding it uses only once its members are
// written.
func (c *canonWriter) str(i int, key bool) (int, []byte) {
	end, plain := stringEnd(c.doc, i)
	if end < 0 {
		return -1, nil
	}
	raw := c.doc[i+1 : end-1]
	if plain {
		c.out = append(c.out, c.doc[i:end]...)
		return end, raw
	}
	if !key {
		c.tmp = unquote(c.tmp[:0], raw)
		c.out = appendQuoted(c.out, c.tmp)
		return end, nil
	}
	keyStart := len(c.keys)
	c.keys = unquote(c.keys, raw)
	decoded := c.keys[keyStart:len(c.keys):len(c.keys)]
	c.out = appendQuoted(c.out, decoded)
	return end, decoded
}

// stringEnd is jsonscan.StringEnd(doc, i), and whether the string is plain: written by
// encoding/json's encoder as it is (no escape, UTF-8, no U+2028 or U+2029), so that its bytes are
// its canonical form. It makes one pass over a plain string (a string found not plain is passed
// over again by StringEnd); the second pass it saves was a tenth of Canonical's instructions.
func stringEnd(doc []byte, i int) (end int, plain bool) {
	if i < 0 || i >= len(doc) || doc[i] != '"' {
		return -1, false
	}
	for k := i + 1; k < len(doc); k++ {
		switch c := doc[k]; {
		case c == '"':
			return k + 1, true
		case c < 0x20:
			return -1, false
		case c == '\\':
			return jsonscan.StringEnd(doc, i), false
		case c >= utf8.RuneSelf:
			// A rune decoded holds no quote, backslash or control byte: its bytes are all
			// 0x80 or above.
			r, size := utf8.DecodeRune(doc[k:])
			if r == utf8.RuneError && size == 1 || r == '\u2028' || r == '\u2029' {
				return jsonscan.StringEnd(doc, i), false
			}
			k += size - 1
		}
	}
	return -1, false
}

// unquote appends to dst the decoded contents s of a valid JSON string, as encoding/json's
// decoder decodes it: an escaped surrogate not in a valid pair, and a byte that is not UTF-8, as
// U+FFFD.
func unquote(dst, s []byte) []byte {
	for k := 0; k < len(s); {
		b := s[k]
		switch {
		case b == '\\':
			k++
			switch s[k] {
			case 'b':
				dst = append(dst, '\b')
			case 'f':
				dst = append(dst, '\f')
			case 'n':
				dst = append(dst, '\n')
			case 'r':
				dst = append(dst, '\r')
			case 't':
				dst = append(dst, '\t')
			case 'u':
				r := jsonscan.Hex4(s[k+1:])
				k += 5
				if utf16.IsSurrogate(r) {
					if k+6 <= len(s) && s[k] == '\\' && s[k+1] == 'u' {
						if dec := utf16.DecodeRune(r, jsonscan.Hex4(s[k+2:])); dec != utf8.RuneError {
							dst = utf8.AppendRune(dst, dec)
							k += 6
							continue
						}
					}
					r = utf8.RuneError
				}
				dst = utf8.AppendRune(dst, r)
				continue
			default: // '"', '\\', '/'
				dst = append(dst, s[k])
			}
			k++
		case b < utf8.RuneSelf:
			dst = append(dst, b)
			k++
		default:
			r, size := utf8.DecodeRune(s[k:])
			dst = utf8.AppendRune(dst, r)
			k += size
		}
	}
	return dst
}

// appendQuoted appends s (UTF-8, as unquote writes it) quoted as encoding/json's encoder quotes
// a string without HTML escaping: `"` and `\` escaped, control characters as \b, \f, \n, \r, \t
// or \u00XX, U+2028 and U+2029 as \u2028 and \u2029, anything else as it is.
func appendQuoted(dst, s []byte) []byte {
	const hex = "0123456789abcdef"
	dst = append(dst, '"')
	start := 0
	for k := 0; k < len(s); {
		b := s[k]
		if b >= utf8.RuneSelf {
			r, size := utf8.DecodeRune(s[k:])
			if r == '\u2028' || r == '\u2029' {
				dst = append(dst, s[start:k]...)
				dst = append(dst, '\\', 'u', '2', '0', '2', hex[r&0xF])
				start = k + size
			}
			k += size
			continue
		}
		if b >= 0x20 && b != '"' && b != '\\' {
			k++
			continue
		}
		dst = append(dst, s[start:k]...)
		switch b {
		case '"', '\\':
			dst = append(dst, '\\', b)
		case '\b':
			dst = append(dst, '\\', 'b')
		case '\f':
			dst = append(dst, '\\', 'f')
		case '\n':
			dst = append(dst, '\\', 'n')
		case '\r':
			dst = append(dst, '\\', 'r')
		case '\t':
			dst = append(dst, '\\', 't')
		default:
			dst = append(dst, '\\', 'u', '0', '0', hex[b>>4], hex[b&0xF])
		}
		k++
		start = k
	}
	dst = append(dst, s[start:]...)
	return append(dst, '"')
}
