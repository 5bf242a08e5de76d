package jsonscan

// Keys is the set of keys a walk of an object's members reads (see Object): a key holding a
// byte outside it ends the walk, refused, for a caller that then leaves the object to
// encoding/json. Neither set holds the backslash, so a key read is the key itself, no escape in
// it to decode.
type Keys uint8

const (
	// LowerKeys are keys of lower case ASCII letters, digits and _ only: such a key matches a
	// json tag of those bytes byte for byte, as json.Unmarshal would match it, so that its reader
	// need not fold case.
	LowerKeys Keys = iota
	// ASCIIKeys are keys of ASCII bytes but control bytes (below 0x20) and the backslash: keys
	// that json.Unmarshal matches to a field's name by ASCII case folding only (no escape, and
	// no byte that is not ASCII, which bytes.EqualFold may fold to an ASCII letter).
	ASCIIKeys
)

// Object walks the members of one JSON object in order, for a reader that reads each member's
// value itself (checking it or not, as it needs) and says where it ends:
//
//	obj := jsonscan.ObjectAt(data, i, jsonscan.LowerKeys)
//	for obj.Next() {
//		end := jsonscan.Value(data, obj.Value)
//		if end < 0 {
//			return -1
//		}
//		// ... obj.Key, data[obj.Value:end] ...
//		obj.ValueEnds(end)
//	}
//	return obj.End() // -1: malformed, or a key refused
//
// It reads no more than the object: its opening brace, keys, colons, commas and closing brace,
// and the white space between them. It checks those (a key is one string of its Keys; a member
// is a key, a colon and a value; members are separated by commas; the object ends at a closing
// brace) but not the values. It allocates nothing and never reads outside data. Repeated keys
// are each walked: a reader that wants json.Unmarshal's answer keeps the last. A walk costs one
// call a member (Next; ObjectAt, ValueEnds and End are inlined) and its state's loads and stores:
// some 1% over tokens' loop, which called a closure a member, but 3-18% over llm's answer and
// usage loops, which made no call and kept to registers: those stay hand loops (see
// docs/decisions.md).
type Object struct {
	// Key is the key of the member Next read, between its quotes (a slice of data).
	Key []byte
	// Value is the index of the first byte of the member's value (white space before it passed
	// over; len(data) at the end of data), -1 when Next has read no member.
	Value int

	data []byte
	keys Keys
	// at is where Next reads: the first key's index before the first member, after a member the
	// end of its value (told by ValueEnds); -1 when there is nothing to read.
	at  int
	end int // index just past the object's closing brace once read, else -1
}

// ObjectAt starts a walk of the object whose opening brace is data[i] (no white space before
// it): one that reads no member, its End -1, when data[i] is not an opening brace.
func ObjectAt(data []byte, i int, keys Keys) Object {
	o := Object{Value: -1, data: data, keys: keys, at: -1, end: -1}
	if i >= 0 && i < len(data) && data[i] == '{' {
		o.at = SkipSpace(data, i+1) // Next reads the closing brace of an empty object
	}
	return o
}

// Next reads the next member's key and the colon after it, setting Key and Value, and reports
// whether it read one. It is false at the end of the object (End then the index past it), when
// the object is malformed or a key is not of the walk's Keys (End then -1), and when the value
// of the member before was not told to ValueEnds, or was told ending at or before its start.
func (o *Object) Next() bool {
	i, data := o.at, o.data
	first := o.Value < 0
	if !first { // after a member: what follows its value
		if i <= o.Value || i > len(data) {
			i = -1
		} else if i = SkipSpace(data, i); i < len(data) && data[i] == ',' {
			i = SkipSpace(data, i+1)
		} else {
			if i < len(data) && data[i] == '}' {
				o.end = i + 1
			}
			i = -1
		}
	}
	o.at, o.Value = -1, -1
	if i < 0 || i >= len(data) {
		return false
	}
	if data[i] != '"' {
		if first && data[i] == '}' { // an empty object
			o.end = i + 1
		}
		return false
	}
	start := i + 1
	switch o.keys {
	case LowerKeys:
		for i = start; i < len(data) && data[i] != '"'; i++ {
			if c := data[i]; !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_') {
				return false
			}
		}
	default: // ASCIIKeys
		for i = start; i < len(data) && data[i] != '"'; i++ {
			if c := data[i]; c < 0x20 || c == '\\' || c >= 0x80 {
				return false
			}
		}
	}
	if i >= len(data) {
		return false
	}
	key := data[start:i]
	if i = SkipSpace(data, i+1); i >= len(data) || data[i] != ':' {
		return false
	}
	o.Key, o.Value = key, SkipSpace(data, i+1)
	return true
}

// ValueEnds tells the walk that the value of the member Next read ends just before data[end]:
// the next Next reads from there a comma before the next member, or the object's closing brace.
// An end not past Value (-1 for a value its reader found malformed, or Value itself: no value)
// ends the walk there as malformed. Told when Next read no member, it is ignored.
func (o *Object) ValueEnds(end int) {
	if o.Value >= 0 {
		o.at = end
	}
}

// End is the index just past the object's closing brace once Next has reported false at it;
// -1 before, and for an object that is malformed or has a key not of the walk's Keys. What
// follows the object is not read.
func (o *Object) End() int {
	return o.end
}
