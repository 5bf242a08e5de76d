package idem

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestFingerprint_Golden pins the fingerprints of documents as earlier releases stored them (the
// hex digits are 7b8c9a6's, equal to encoding/json's form's): a key claimed before an upgrade
// must match its resend after it. The documents are walked in the writer's own space and past it,
// their objects in order and not, with repeated keys, escapes and bytes that are not UTF-8.
func TestFingerprint_Golden(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ doc, want string }{
		{string(benchDoc), "eb299485fb345616e6bb4f9c1ccab9be7a2f9a9b7d59af41b55aae9450fbb6ce"},
		{`{"a":1,"b":[true,false,null],"c":{"d":"e"}}`,
			"60907ee8377d369bee806b1cdbcf6bc5565dd1dad4abf3284417f9c8782f8ed3"},
		{`{"b":1,"a":1,"b":2,"\u0061":3}`,
			"493df656a590967c84d643bdd55ee956fb53262c51b154115083c9bcc4c992e3"},
		{`{"request":{"model":"m","messages":[` +
			`{"role":"user","content":"<&> \u2028 \ud83d\ude00 \ud800 é ` +
			`\"q\" \\ \n\t"}]},"metadata":{"z":-0.0e-0,"y":1E+5}}`,
			"7192674df74fee93f3b4b8dd3099f6b8b1fca9b2452b6e1787a9f15e16ffe48f"},
		{"{\"k\xff\":\"v\xfe\",\"\u2029\":\"\\u2029\"}",
			"097a6da667fabaaffccaff7f1733920719e2f7cfa051351c6d96e41164066bee"},
		{`{"request":{"model":"m","messages":[` +
			strings.Repeat(`{"role":"user","content":"a long message, past the writer's own space"},`, 20) +
			`{"content":"x","role":"assistant"}]},"timeout":"1m"}`,
			"cbaccece64657843fa0ceec5625f12c59200e6cb7a11e8b0b0fefad8502ae6f3"},
	} {
		got, err := Fingerprint([]byte(tc.doc))
		require.NoError(t, err)
		require.Equal(t, tc.want, got, "%.60q", tc.doc)
		checkCanonical(t, []byte(tc.doc))
	}
}

// TestFingerprint_Allocs pins the allocations of a keyed submit's fingerprint of the usual
// body: the walk's writer, its members, out and scratch space in one, and the answer's string;
// five before (the three apart, and hex.EncodeToString's two).
func TestFingerprint_Allocs(t *testing.T) { // not parallel: AllocsPerRun counts every goroutine's
	if raceEnabled {
		t.Skip("allocation counts are the build's without the race detector")
	}
	allocs := testing.AllocsPerRun(100, func() {
		if _, err := Fingerprint(benchDoc); err != nil {
			panic(err)
		}
	})
	require.LessOrEqual(t, allocs, 2.0, "allocations a fingerprint")
	allocs = testing.AllocsPerRun(100, func() { _, _ = Canonical(benchDoc) })
	require.LessOrEqual(t, allocs, 1.0, "allocations a canonical form")
}
