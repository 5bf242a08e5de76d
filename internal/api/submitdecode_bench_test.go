package api

import "testing"

// benchSubmitBody is the body bench/'s clients send (jobBody with messagesBody).
var benchSubmitBody = []byte(`{"request":{"model":"claude-bench","max_tokens":16,"messages":[{"role":"user","content":"bench request 1"}]},"max_attempts":3,"timeout":"2m0s"}`)

// BenchmarkDecodeSubmit is the submit's decode of the usual body: the walk and the names' check.
func BenchmarkDecodeSubmit(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		if _, err := decodeSubmit(benchSubmitBody); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkDecodeSubmitBefore is the decode as it was (0858888), the reference of
// BenchmarkDecodeSubmit: the walk, then the old names' check of the whole body.
func BenchmarkDecodeSubmitBefore(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		if _, ok := scanSubmit(benchSubmitBody); !ok {
			b.Fatal("not walked")
		}
		if err := refCheckFieldNames(benchSubmitBody); err != nil {
			b.Fatal(err)
		}
	}
}
