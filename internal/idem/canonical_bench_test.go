package idem

import "testing"

// benchDoc is the body bench/'s clients send (jobBody with messagesBody).
var benchDoc = []byte(`{"request":{"model":"claude-bench","max_tokens":16,"messages":[{"role":"user","content":"bench request 1"}]},"max_attempts":3,"timeout":"2m0s"}`)

// BenchmarkFingerprint is a keyed submit's fingerprint of the usual body.
func BenchmarkFingerprint(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Fingerprint(benchDoc); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkCanonicalJSON is the canonical form by encoding/json, the walk's reference.
func BenchmarkCanonicalJSON(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		if _, err := canonicalJSON(benchDoc); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkCanonical is the canonical form by the walk.
func BenchmarkCanonical(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Canonical(benchDoc); err != nil {
			b.Fatal(err)
		}
	}
}
