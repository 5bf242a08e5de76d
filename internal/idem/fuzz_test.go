package idem_test

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/llmq/llmq/internal/idem"
)

// FuzzFingerprint checks, for any input, that Canonical and Fingerprint never panic, accept
// exactly the valid JSON documents, are idempotent, and give a re-marshalled equivalent (other
// key order, indentation, escaping) the same fingerprint.
func FuzzFingerprint(f *testing.F) {
	for _, s := range []string{
		`{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":10}`,
		`{"b":1,"a":{"d":[1,2,{"f":null,"e":true}],"c":"x"}}`,
		`[1, 1.0, 1e2, -0, 12345678901234567890123, 0.1]`,
		`"<&>\u2028\u2029\ud800\/"`,
		`{"a":1,"a":2}`,
		"{\"\xff\":\"\xfe\"}",
		` {"a" : [ ] , "b" : { } } `,
		`null`, `true`, `0`, `""`,
		``, `{`, `{"a":1} x`, `1 2`, `[1,]`, `{"a":1}]`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, doc []byte) {
		canon, err := idem.Canonical(doc)
		fp, fpErr := idem.Fingerprint(doc)
		if (err == nil) != (fpErr == nil) {
			t.Fatalf("Canonical err %v but Fingerprint err %v", err, fpErr)
		}
		if valid := json.Valid(doc); valid != (err == nil) {
			t.Fatalf("json.Valid = %v but Canonical err = %v for %q", valid, err, doc)
		}
		if err != nil {
			return
		}

		again, err := idem.Canonical(canon)
		if err != nil {
			t.Fatalf("Canonical of canonical %q: %v", canon, err)
		}
		if !bytes.Equal(again, canon) {
			t.Fatalf("not idempotent:\n%q\n%q", canon, again)
		}
		if fp2, err := idem.Fingerprint(canon); err != nil || fp2 != fp {
			t.Fatalf("fingerprint of canonical form differs: %s vs %s (%v)", fp, fp2, err)
		}

		// An equivalent document written differently: decoded, then re-marshalled indented and
		// with HTML escaping on.
		dec := json.NewDecoder(bytes.NewReader(doc))
		dec.UseNumber()
		var v any
		if err := dec.Decode(&v); err != nil {
			t.Fatalf("decode valid %q: %v", doc, err)
		}
		other, err := json.MarshalIndent(v, " ", "\t")
		if err != nil {
			t.Fatalf("re-marshal %q: %v", doc, err)
		}
		fp3, err := idem.Fingerprint(other)
		if err != nil {
			t.Fatalf("fingerprint of re-marshalled %q: %v", other, err)
		}
		if fp3 != fp {
			t.Fatalf("re-marshalled equivalent has another fingerprint:\n%q\n%q", doc, other)
		}
	})
}
