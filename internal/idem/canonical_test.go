package idem

import (
	"bytes"
	"fmt"
	"strings"
	"testing"
)

// canonicalCases are documents whose canonical forms the walk (appendCanonical) and the decode
// (canonicalJSON) must agree on: escapes, Unicode, repeated keys, nesting, numbers, white space.
var canonicalCases = []string{
	`{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":10}`,
	`{"b":1,"a":{"d":[1,2,{"f":null,"e":true}],"c":"x"}}`,
	`[1, 1.0, 1e2, -0, 12345678901234567890123, 0.1, 1e5, 1E+5, -0.0e-0, 1.5e-300, 1e400]`,
	`"<&>\u2028\u2029\ud800\/"`,
	`"` + "\u2028\u2029" + `"`,
	`"\u003c\u0026\u003e\u00e9\u0000\u001f\u007f\u0080"`,
	`"\b\f\n\r\t\"\\\/ \u0008\u000c\u000a\u000d\u0009\u0022\u005c\u002f"`,
	`"\ud83d\ude00 \ud83d \ude00 \ud83d\u0041 \udbff\udfff \ud800\ud800\udc00 \uDBFF\uDFFF"`,
	`"\ud83dx" `, `"\ud83d\n"`, `"\ud83d\\ude00"`, `"a\ud800"`, `"\uFFFD\uffff\ufffe"`,
	"\"\xff\xfe \xe2\x80 \xed\xa0\x80 \xf4\x90\x80\x80 \xc0\x80 \xef\xbf\xbd\"",
	"{\"\xff\":\"\xfe\",\"\xef\xbf\xbd\":1}",
	`{"a":1,"a":2}`,
	`{"a":1,"b":2,"a":3}`,
	`{"b":[1],"a":{"x":1},"b":{"y":2},"a":null}`,
	`{"\u0061":1,"a":2}`,
	`{"a":2,"\u0061":1}`,
	`{"\ud800":1,"\udfff":2,"\ufffd":3,"` + "\xff" + `":4}`,
	`{"é":1,"e":2,"E":3,"":4,"\u0000":5," ":6,"~":7,"\u007f":8,"` + "\u2028" + `":9,"\u2029":10}`,
	`{"aa":1,"a":2,"a\u0000":3,"ab":4,"b":5}`,
	`{"z":{"y":{"x":{"w":[{"v":1,"u":2}]}}},"a":[[],{},[{}],{"":[]}]}`,
	` {"a" : [ ] , "b" : { } } `,
	"\t\r\n {\"a\"\t:\r1\n,\"b\":[ 1 , 2 ]}\n\t ",
	`{}`, `[]`, `[{}]`, `[[]]`, `{"":{}}`,
	`null`, `true`, `false`, `0`, `-0`, `""`, `"x"`, `1e5`, `-1.25E-10`,
	`123456789012345678901234567890.123456789e-123456`,
	strings.Repeat(`[`, 511) + strings.Repeat(`]`, 511),
	strings.Repeat(`{"a":`, 600) + `1` + strings.Repeat(`}`, 600),
	strings.Repeat(`[`, 600) + strings.Repeat(`]`, 600),
	``, ` `, `{`, `{"a":1} x`, `1 2`, `[1,]`, `{"a":1}]`, `{"a":1,}`, `{"a" 1}`, `{1:2}`,
	`[01]`, `[1.]`, `[-]`, `[.5]`, `[1e]`, `tru`, `nul`, `"abc`, `"\x"`, `"\u12"`, "\"\x01\"",
	"\ufeff{}", `{"a":1}` + "\f", `{"a":1}` + "\u00a0", `[1,2`, `{"a":[}`, `]`, `}`,
	strings.Repeat(`[`, 10001) + strings.Repeat(`]`, 10001),
	// Keys equal once decoded, in either order; keys ordered by UTF-8 bytes (U+FFFF before
	// U+1F600, which UTF-16 would order after it).
	`{"\/":1,"/":2}`, `{"/":1,"\/":2}`, `{"\u2028":1,"` + "\u2028" + `":2}`, `{"` + "\u2028" + `":1,"\u2028":2}`,
	`{"\u00e9":1,"\uffff":2,"\ud83d\ude00":3,"` + "\U0001F600" + `":4,"\uFFFF":5}`,
	`["\u0000","` + "\x7f" + `","\u007f","\/","\u2029"]`, `"\udc00\ud800"`, `"\ud800\uDFFF"`, "\"\xf0\x9f\x98\"",
	// 512 objects deep (the walk's), 513 (the decode's).
	strings.Repeat(`{"a":`, 511) + `[]` + strings.Repeat(`}`, 511),
	strings.Repeat(`{"a":`, 512) + `1` + strings.Repeat(`}`, 512),
	strings.Repeat(`{"a":`, 513) + `1` + strings.Repeat(`}`, 513),
	"\xef\xbb\xbf{}", "\v1", "\x001", "1\x00", `{"a":1}{}`, `[][]`, `1E+2`, ` -0.0e-0 `, `-0E+00`, `1.e1`, `--1`,
	`{"a":{"b":1,"b":{"c":[1,{"d":2,"d":3}]}},"a":{"z":1,"y":{"x":1,"x":2}}}`,
	// More members than sortMembers sorts by insertion, out of order and repeated.
	manyMembers(40), manyMembers(17), manyMembers(16),
}

// manyMembers is an object of n members whose keys come in reverse order, every third repeated.
func manyMembers(n int) string {
	var b strings.Builder
	b.WriteByte('{')
	for k := n; k > 0; k-- {
		fmt.Fprintf(&b, `"k%02d":%d,`, k/3*3, k)
	}
	b.WriteString(`"":0}`)
	return b.String()
}

// TestCanonical_AsTheDecode pins the walk's canonical form to encoding/json's (canonicalJSON),
// byte for byte, and its refusals to the decode's errors: fingerprints stored by earlier releases
// must match a resend after an upgrade.
func TestCanonical_AsTheDecode(t *testing.T) {
	t.Parallel()
	for _, doc := range canonicalCases {
		checkCanonical(t, []byte(doc))
	}
}

// checkCanonical fails t when Canonical's answer for doc is not canonicalJSON's.
func checkCanonical(t *testing.T, doc []byte) {
	t.Helper()
	want, wantErr := canonicalJSON(doc)
	got, err := Canonical(doc)
	if (err == nil) != (wantErr == nil) || err != nil && err.Error() != wantErr.Error() {
		t.Fatalf("%.80q: error %v, the decode's %v", doc, err, wantErr)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("%.80q:\n got %q\nwant %q", doc, got, want)
	}
}

// TestCanonical_WalksTheUsualDocument: the documents clients send are written by the walk (the
// gain is lost, silently, to encoding/json otherwise), in one allocation: the writer, holding its
// answer, its members' stack and its scratch space (three allocations apart before; encoding/json's
// decode and encode take dozens).
func TestCanonical_WalksTheUsualDocument(t *testing.T) {
	for _, doc := range []string{
		`{"request":{"model":"claude-bench","max_tokens":16,"messages":[{"role":"user","content":"bench request 1"}]},"max_attempts":3,"timeout":"2m0s"}`,
		`{"credential":"oai","request":{"model":"gpt","messages":[{"role":"system","content":"Be brief.\nAnswer in \"French\"."},` +
			`{"role":"user","content":"Qu'est-ce que c'est ? é ü 日本"}],"n":1,"stream":true},"metadata":{"b":1,"a":[1.5,-0,1e5]}}`,
	} {
		if _, ok := appendCanonical(nil, []byte(doc)); !ok {
			t.Fatalf("%q: not walked", doc)
		}
		checkCanonical(t, []byte(doc))
		data := []byte(doc)
		if allocs := testing.AllocsPerRun(20, func() { _, _ = Canonical(data) }); allocs > 1 && !raceEnabled {
			t.Fatalf("%q: %v allocations a document, want 1", doc, allocs)
		}
	}
}

// TestCanonical_LeavesDeepCopiesToTheDecode: a document nesting a large member in hundreds of
// objects is left to encoding/json, linear in it, rather than copied once for each object it is
// in (seconds of CPU for a 4 MiB body): the walk stops, and the answer is the decode's.
func TestCanonical_LeavesDeepCopiesToTheDecode(t *testing.T) {
	t.Parallel()
	doc := []byte(strings.Repeat(`{"b":1,"a":`, 500) + `"` + strings.Repeat("x", 64<<10) + `"` + strings.Repeat(`}`, 500))
	if _, ok := appendCanonical(nil, doc); ok {
		t.Fatal("the walk copied the large member once for each of 500 objects")
	}
	checkCanonical(t, doc)
	// A few objects deep, it is walked.
	doc = []byte(strings.Repeat(`{"b":1,"a":`, 8) + `"` + strings.Repeat("x", 64<<10) + `"` + strings.Repeat(`}`, 8))
	if _, ok := appendCanonical(nil, doc); !ok {
		t.Fatal("8 objects deep: not walked")
	}
	checkCanonical(t, doc)
}

// FuzzCanonical compares the walk with encoding/json's decode and encode on any input: the same
// bytes, or the same error.
func FuzzCanonical(f *testing.F) {
	for _, doc := range canonicalCases {
		f.Add([]byte(doc))
	}
	f.Fuzz(func(t *testing.T, doc []byte) {
		checkCanonical(t, doc)
	})
}
