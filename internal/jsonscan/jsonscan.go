// Package jsonscan walks JSON text already known to be valid without decoding it: the hand
// readers of the per-job hot paths (tokens' request scan, llm's usage and stream chunk reads)
// find a member's value with it and hand anything unusual to encoding/json. One home for the
// walk, so that the readers cannot drift apart on what ends a value.
package jsonscan

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
	depth, inString, escaped := 0, false, false
	for j := i; j < len(data); j++ {
		c := data[j]
		switch {
		case inString:
			switch {
			case escaped:
				escaped = false
			case c == '\\':
				escaped = true
			case c == '"':
				inString = false
				if depth == 0 {
					return j + 1
				}
			}
		case c == '"':
			inString = true
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
