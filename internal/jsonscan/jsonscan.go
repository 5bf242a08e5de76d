// Package jsonscan walks JSON text without decoding it: the hand readers of the per-job hot
// paths (tokens' request scan, llm's usage and stream chunk reads) find a member's value with it
// and hand anything unusual to encoding/json; Object walks an object's members for a reader of
// the values. ValueEnd walks text already known to be valid;
// Value and Valid check it as they walk (json.Valid's scanner was most of a request count's
// instructions: issue 23). One home for the walk, so that the readers cannot drift apart on what
// ends a value.
package jsonscan

import "encoding/json"

// MaxDepth is the nesting of arrays and objects Value reads: it refuses deeper JSON, which
// encoding/json reads up to its own limit (10000), so that a caller leaves it to encoding/json.
const MaxDepth = 512

// SkipSpace is the index of the first byte of data from i that is not JSON white space (space,
// tab, newline, carriage return), len(data) when there is none.
func SkipSpace(data []byte, i int) int {
	for i < len(data) && (data[i] == ' ' || data[i] == '\t' || data[i] == '\n' || data[i] == '\r') {
		i++
	}
	return i
}

// ValueEnd is the index just past the JSON value starting at data[i]: past a string's closing
// quote, an object's or an array's closing bracket, or at the byte ending a literal (a comma,
// white space, a closing bracket, or the end of data). It checks nothing: for data that is not
// valid JSON it returns an index no larger than len(data) (len(data) when a string or a bracket
// is left open; i itself when data[i] closes a bracket), which a caller reading malformed JSON
// must not take for a value.
func ValueEnd(data []byte, i int) int {
	depth := 0
	for j := i; j < len(data); j++ {
		switch c := data[j]; {
		case c == '"':
			if j = closingQuote(data, j); depth == 0 && j < len(data) {
				return j + 1
			}
		case c == '{' || c == '[':
			depth++
		case c == '}' || c == ']':
			if depth == 0 {
				return j // a literal's end: the bracket of what holds it
			}
			if depth--; depth == 0 {
				return j + 1
			}
		case depth == 0 && (c == ',' || c == ' ' || c == '\t' || c == '\n' || c == '\r'):
			return j // a literal's end
		}
	}
	return len(data) // a literal ending data, or malformed data
}

// closingQuote is the index of the quote closing the string whose opening quote is data[i],
// passing over escaped bytes, len(data) when the string is left open. It checks nothing: what
// ValueEnd and depthExceeded pass over.
func closingQuote(data []byte, i int) int {
	for i++; i < len(data); i++ {
		switch data[i] {
		case '\\':
			i++ // the escaped byte
		case '"':
			return i
		}
	}
	return len(data)
}

// Valid reports whether data is one valid JSON value with white space around it, as json.Valid
// does (which it calls for JSON nested deeper than MaxDepth). Bytes that are not UTF-8 in a
// string are valid, as for json.Valid.
func Valid(data []byte) bool {
	i := SkipSpace(data, 0)
	end := Value(data, i)
	if end < 0 {
		return depthExceeded(data, i) && json.Valid(data)
	}
	return SkipSpace(data, end) == len(data)
}

// depthExceeded reports whether the JSON value at data[i] may be nested deeper than MaxDepth: its
// brackets, counted outside strings, reach that depth. Only Valid's refusals pay for it.
func depthExceeded(data []byte, i int) bool {
	depth := 0
	for j := max(i, 0); j < len(data); j++ {
		switch data[j] {
		case '"':
			j = closingQuote(data, j)
		case '{', '[':
			if depth++; depth > MaxDepth {
				return true
			}
		case '}', ']':
			depth--
		}
	}
	return false
}

// following reads what follows a member or an element that ends at data[i] (white space first)
// in an object or array closed by closer: after a comma, the index of the next one (more);
// else the index just past closer, or -1 for anything but closer.
func following(data []byte, i int, closer byte) (next int, more bool) {
	if i = SkipSpace(data, i); i >= len(data) {
		return -1, false
	}
	switch data[i] {
	case ',':
		return SkipSpace(data, i+1), true
	case closer:
		return i + 1, false
	}
	return -1, false
}

// Value is the index just past the valid JSON value starting at data[i] (no white space before
// it), or -1 when data holds none there: malformed JSON, the end of data, or arrays and objects
// nested deeper than MaxDepth. What follows the value is not read: a literal or a number ends at
// the first byte that cannot continue it, which the caller checks. Strings are checked as
// json.Valid checks them (control bytes and escapes, not UTF-8). It never reads outside data.
func Value(data []byte, i int) int {
	return value(data, i, 0)
}

// value is Value inside depth arrays and objects.
func value(data []byte, i, depth int) int {
	if i < 0 || i >= len(data) {
		return -1
	}
	switch c := data[i]; {
	case c == '"':
		return StringEnd(data, i)
	case c == '{':
		if depth >= MaxDepth {
			return -1
		}
		i = SkipSpace(data, i+1)
		if i < len(data) && data[i] == '}' {
			return i + 1
		}
		for {
			if i >= len(data) || data[i] != '"' {
				return -1
			}
			if i = StringEnd(data, i); i < 0 {
				return -1
			}
			if i = SkipSpace(data, i); i >= len(data) || data[i] != ':' {
				return -1
			}
			if i = value(data, SkipSpace(data, i+1), depth+1); i < 0 {
				return -1
			}
			var more bool
			if i, more = following(data, i, '}'); !more {
				return i
			}
		}
	case c == '[':
		if depth >= MaxDepth {
			return -1
		}
		i = SkipSpace(data, i+1)
		if i < len(data) && data[i] == ']' {
			return i + 1
		}
		for {
			if i = value(data, i, depth+1); i < 0 {
				return -1
			}
			var more bool
			if i, more = following(data, i, ']'); !more {
				return i
			}
		}
	case c == 't':
		return literalEnd(data, i, "true")
	case c == 'f':
		return literalEnd(data, i, "false")
	case c == 'n':
		return literalEnd(data, i, "null")
	case c == '-' || c >= '0' && c <= '9':
		return numberEnd(data, i)
	}
	return -1
}

// StringEnd is the index just past the valid JSON string whose opening quote is data[i], or -1
// when there is none (a control byte, a malformed escape, no closing quote). It never reads
// outside data.
func StringEnd(data []byte, i int) int {
	if i < 0 || i >= len(data) || data[i] != '"' {
		return -1
	}
	for i++; i < len(data); i++ {
		c := data[i]
		if c >= 0x20 && c != '"' && c != '\\' {
			continue
		}
		switch c {
		case '"':
			return i + 1
		case '\\':
			if i++; i >= len(data) {
				return -1
			}
			switch data[i] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
			case 'u':
				if i+4 >= len(data) || !isHex(data[i+1]) || !isHex(data[i+2]) || !isHex(data[i+3]) || !isHex(data[i+4]) {
					return -1
				}
				i += 4
			default:
				return -1
			}
		default: // a control byte
			return -1
		}
	}
	return -1
}

// literalEnd is the index just past lit (true, false or null) at data[i], or -1.
func literalEnd(data []byte, i int, lit string) int {
	if len(data)-i < len(lit) || string(data[i:i+len(lit)]) != lit {
		return -1
	}
	return i + len(lit)
}

// numberEnd is the index just past the JSON number at data[i] (a minus, an integer without a
// leading zero, a fraction, an exponent), or -1 when it is malformed.
func numberEnd(data []byte, i int) int {
	if data[i] == '-' {
		i++
	}
	switch {
	case i >= len(data):
		return -1
	case data[i] == '0':
		i++
	case data[i] >= '1' && data[i] <= '9':
		i = digitsEnd(data, i+1)
	default:
		return -1
	}
	if i < len(data) && data[i] == '.' {
		j := digitsEnd(data, i+1)
		if j == i+1 {
			return -1
		}
		i = j
	}
	if i < len(data) && (data[i] == 'e' || data[i] == 'E') {
		i++
		if i < len(data) && (data[i] == '+' || data[i] == '-') {
			i++
		}
		j := digitsEnd(data, i)
		if j == i {
			return -1
		}
		i = j
	}
	return i
}

// digitsEnd is the index of the first byte from data[i] that is not a decimal digit.
func digitsEnd(data []byte, i int) int {
	for i < len(data) && data[i] >= '0' && data[i] <= '9' {
		i++
	}
	return i
}

// Hex4 is the value of the four hexadecimal digits s starts with: those of a \u escape of a
// string StringEnd or Value checked (it checks nothing itself). One home for the readers that
// decode such an escape (tokens' text, idem's canonical form).
func Hex4(s []byte) rune {
	var r rune
	for _, c := range s[:4] {
		switch {
		case c >= '0' && c <= '9':
			c -= '0'
		case c >= 'a' && c <= 'f':
			c -= 'a' - 10
		default:
			c -= 'A' - 10
		}
		r = r<<4 | rune(c)
	}
	return r
}

// isHex reports whether c is a hexadecimal digit.
func isHex(c byte) bool {
	return c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F'
}
