package jsonscan_test

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/jsonscan"
)

// member is a member a walk read: its key and its value's text.
type member struct{ key, value string }

// walk walks the object at data[i] with Object, reading each value with valueEnd (Value or
// ValueEnd): the members read, and the object's end (-1 when the walk, or a value, was refused).
func walk(data []byte, i int, keys jsonscan.Keys, valueEnd func([]byte, int) int) ([]member, int) {
	var members []member
	obj := jsonscan.ObjectAt(data, i, keys)
	for obj.Next() {
		end := valueEnd(data, obj.Value)
		if end <= obj.Value {
			return members, -1
		}
		members = append(members, member{string(obj.Key), string(data[obj.Value:end])})
		obj.ValueEnds(end)
	}
	return members, obj.End()
}

// handWalk is the hand loop Object replaced (tokens' scanObject, llm's readInts and scanAnswer
// each had one): the reference a walk must match, member for member.
func handWalk(data []byte, i int, keys jsonscan.Keys, valueEnd func([]byte, int) int) ([]member, int) {
	var members []member
	if i >= len(data) || data[i] != '{' {
		return members, -1
	}
	i = jsonscan.SkipSpace(data, i+1)
	if i < len(data) && data[i] == '}' {
		return members, i + 1
	}
	for {
		if i >= len(data) || data[i] != '"' {
			return members, -1
		}
		start := i + 1
		for i = start; i < len(data) && data[i] != '"'; i++ {
			c := data[i]
			if keys == jsonscan.LowerKeys && !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_') ||
				keys == jsonscan.ASCIIKeys && (c < 0x20 || c == '\\' || c >= 0x80) {
				return members, -1
			}
		}
		if i >= len(data) {
			return members, -1
		}
		key := data[start:i]
		if i = jsonscan.SkipSpace(data, i+1); i >= len(data) || data[i] != ':' {
			return members, -1
		}
		i = jsonscan.SkipSpace(data, i+1)
		end := valueEnd(data, i)
		if end <= i {
			return members, -1
		}
		members = append(members, member{string(key), string(data[i:end])})
		if i = jsonscan.SkipSpace(data, end); i >= len(data) {
			return members, -1
		}
		switch data[i] {
		case '}':
			return members, i + 1
		case ',':
			i = jsonscan.SkipSpace(data, i+1)
		default:
			return members, -1
		}
	}
}

// objectCases are objects to walk: usual ones, keys each key set refuses, and malformed ones.
var objectCases = []string{
	`{}`, ` { } `, `{"a":1}`, `{"model":"m","max_tokens":16,"messages":[{"role":"user","content":"hi"}]}`,
	" {\n\t\"a\" : [1, {\"b\":\"}\"}] ,\r\n \"c\":null } ", `{"a":1,"a":2}`, `{"":0}`, `{"a":"\"}"}`,
	`{"A":1}`, `{"a-b":1}`, `{"a b":1}`, `{"\u0061":1}`, `{"a\"b":1}`, "{\"\x7f\":1}", "{\"\x01\":1}",
	"{\"\xc3\xa9\":1}", `{"Usage":{"input_tokens":1}}`, `{"a":1}x`, `{"a":1} `,
	`{`, `{"`, `{"a`, `{"a"`, `{"a":`, `{"a":1`, `{"a":1,`, `{"a":1,}`, `{,}`, `{"a" 1}`, `{a:1}`,
	`{"a":1 "b":2}`, `{"a":}`, `{"a":tru}`, `{"a":[}`, `{"a":1]`, `{"a":1}}`, `[]`, `""`, ``, ` {}`,
	`{"a":` + strings.Repeat("[", 600) + strings.Repeat("]", 600) + `}`,
}

// TestObject_AsTheHandLoops: every walk reads the members and the end the hand loops read, with
// either key set and either value reader, at every index of the data.
func TestObject_AsTheHandLoops(t *testing.T) {
	t.Parallel()
	for _, data := range objectCases {
		requireWalkAsHandLoop(t, []byte(data))
	}
}

// FuzzObject: as TestObject_AsTheHandLoops, on any data.
func FuzzObject(f *testing.F) {
	for _, data := range objectCases {
		f.Add([]byte(data))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		requireWalkAsHandLoop(t, data)
	})
}

func requireWalkAsHandLoop(t *testing.T, data []byte) {
	t.Helper()
	for _, keys := range []jsonscan.Keys{jsonscan.LowerKeys, jsonscan.ASCIIKeys} {
		for _, valueEnd := range []func([]byte, int) int{jsonscan.Value, jsonscan.ValueEnd} {
			for i := range len(data) + 1 {
				wantMembers, wantEnd := handWalk(data, i, keys, valueEnd)
				members, end := walk(data, i, keys, valueEnd)
				if end != wantEnd || !slices.Equal(members, wantMembers) { // require only to say so: it is slow
					require.Equal(t, wantEnd, end, "keys %d, at %d of %q", keys, i, data)
					require.Equal(t, wantMembers, members, "keys %d, at %d of %q", keys, i, data)
				}
			}
		}
	}
	if members, end := walk(data, jsonscan.SkipSpace(data, 0), jsonscan.ASCIIKeys, jsonscan.Value); end >= 0 &&
		jsonscan.SkipSpace(data, end) == len(data) {
		require.True(t, json.Valid(data), "walked %q, which is not JSON", data)
		var decoded map[string]json.RawMessage
		require.NoError(t, json.Unmarshal(data, &decoded))
		last := map[string]json.RawMessage{}
		for _, m := range members {
			last[m.key] = json.RawMessage(m.value)
		}
		require.Equal(t, decoded, last, "the last value of each key, as json: %q", data)
	}
}

// TestObject_Walk: what a walk reads, member by member, and what it refuses.
func TestObject_Walk(t *testing.T) {
	t.Parallel()
	members, end := walk([]byte(`{"a": 1 ,"b" :{"c":[2]},"a":"x"} `), 0, jsonscan.LowerKeys, jsonscan.Value)
	require.Equal(t, []member{{"a", "1"}, {"b", `{"c":[2]}`}, {"a", `"x"`}}, members, "in order, a repeated key each time")
	require.Equal(t, 32, end, "just past the closing brace; what follows is not read")

	for _, tc := range []struct {
		key          string
		lower, ascii bool
	}{
		{"max_tokens2", true, true}, {"", true, true}, {"Usage", false, true}, {"a-b", false, true}, {"a b", false, true},
		{"\x7f", false, true}, {`\u0061`, false, false}, {`a\"b`, false, false}, {"\x1f", false, false},
		{"\xc3\xa9", false, false}, {"\xff", false, false},
	} {
		data := []byte(`{"` + tc.key + `":1}`)
		_, end := walk(data, 0, jsonscan.LowerKeys, jsonscan.Value)
		require.Equal(t, tc.lower, end >= 0, "LowerKeys, key %q", tc.key)
		_, end = walk(data, 0, jsonscan.ASCIIKeys, jsonscan.Value)
		require.Equal(t, tc.ascii, end >= 0, "ASCIIKeys, key %q", tc.key)
	}

	for _, i := range []int{-1, 1, 3} {
		obj := jsonscan.ObjectAt([]byte(`{}`), i, jsonscan.LowerKeys)
		require.False(t, obj.Next(), "at %d: no object", i)
		require.Equal(t, -1, obj.End(), "at %d: no object", i)
	}
}

// TestObject_ValueEnds: a walk goes on from the end its reader tells, and only from one past
// the value's start.
func TestObject_ValueEnds(t *testing.T) {
	t.Parallel()
	data := []byte(`{"a":1,"b":2}`)
	for _, tc := range []struct {
		name string
		tell func(obj *jsonscan.Object)
	}{
		{"NotTold", func(*jsonscan.Object) {}},
		{"Malformed", func(obj *jsonscan.Object) { obj.ValueEnds(-1) }},
		{"NoValue", func(obj *jsonscan.Object) { obj.ValueEnds(obj.Value) }},
		{"PastData", func(obj *jsonscan.Object) { obj.ValueEnds(len(data) + 1) }},
	} {
		obj := jsonscan.ObjectAt(data, 0, jsonscan.LowerKeys)
		require.True(t, obj.Next(), tc.name)
		tc.tell(&obj)
		require.False(t, obj.Next(), tc.name)
		require.Equal(t, -1, obj.End(), tc.name)
		require.False(t, obj.Next(), "%s: the walk stays over", tc.name)
	}

	obj := jsonscan.ObjectAt(data, 0, jsonscan.LowerKeys)
	obj.ValueEnds(3) // before any member: ignored
	require.True(t, obj.Next())
	require.Equal(t, "a", string(obj.Key))
	obj.ValueEnds(6)
	require.True(t, obj.Next())
	require.Equal(t, "b", string(obj.Key))
	require.Equal(t, 11, obj.Value)
	obj.ValueEnds(12)
	require.False(t, obj.Next())
	require.Equal(t, len(data), obj.End())
	obj.ValueEnds(1) // after the walk: ignored
	require.False(t, obj.Next())
	require.Equal(t, len(data), obj.End())
}

// TestObject_NoAllocations: a walk allocates nothing (its state is on its reader's stack).
func TestObject_NoAllocations(t *testing.T) { // not parallel: AllocsPerRun counts every goroutine's allocations
	data := []byte(`{"model":"m","max_tokens":16,"messages":[{"role":"user","content":"hi"}]}`)
	n := 0
	allocs := testing.AllocsPerRun(50, func() {
		obj := jsonscan.ObjectAt(data, 0, jsonscan.LowerKeys)
		for obj.Next() {
			n += len(obj.Key)
			obj.ValueEnds(jsonscan.Value(data, obj.Value))
		}
		if obj.End() != len(data) {
			panic(obj.End())
		}
	})
	require.Zero(t, allocs)
	require.NotZero(t, n)
}
