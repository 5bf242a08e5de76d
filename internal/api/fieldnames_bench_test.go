package api

import "testing"

// benchSubmitRequest is the request of benchSubmitBody: what checkRequestNames walks a submit.
var benchSubmitRequest = []byte(`{"model":"claude-bench","max_tokens":16,` +
	`"messages":[{"role":"user","content":"bench request 1"}]}`)

// BenchmarkCheckRequestNames is the names' check of the usual body's request.
func BenchmarkCheckRequestNames(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		if err := checkRequestNames(benchSubmitRequest); err != nil {
			b.Fatal(err)
		}
	}
}
