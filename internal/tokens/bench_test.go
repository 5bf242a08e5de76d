package tokens_test

import (
	"encoding/base64"
	"fmt"
	"strings"
	"testing"

	"github.com/llmq/llmq/internal/tokens"
)

// BenchmarkCount: the count every submit and every admission makes, of a chat request, of an
// agent's request (tools, tool calls and tool results), of a request with a base64 PDF and of
// one with a base64 image (its size read from its header).
func BenchmarkCount(b *testing.B) {
	text := strings.Repeat("lorem ipsum dolor sit amet ", 40)
	chat := []byte(`{"model":"m","max_tokens":512,"system":"be brief","messages":[` +
		`{"role":"user","content":"` + text + `"},{"role":"assistant","content":"` + text + `"},` +
		`{"role":"user","content":[{"type":"text","text":"` + text + `"}]}]}`)
	var tools, turns strings.Builder
	for i := range 10 {
		if i > 0 {
			tools.WriteByte(',')
			turns.WriteByte(',')
		}
		fmt.Fprintf(&tools, `{"name":"tool%d","description":"%s","input_schema":{"type":"object","properties":{"q":{"type":"string"}}}}`, i, text[:200])
		fmt.Fprintf(&turns, `{"role":"assistant","content":[{"type":"tool_use","id":"t%d","name":"tool%d","input":{"q":"x"}}]},`+
			`{"role":"user","content":[{"type":"tool_result","tool_use_id":"t%d","content":[{"type":"text","text":"%s"}]}]}`, i, i, i, text)
	}
	agent := []byte(`{"model":"m","max_tokens":512,"tools":[` + tools.String() + `],"messages":[{"role":"user","content":"go"},` + turns.String() + `]}`)
	// A PDF of 1 MB, base64: its data is passed over, not copied.
	pdf := []byte(`{"model":"m","max_tokens":512,"messages":[{"role":"user","content":[{"type":"document","source":` +
		`{"type":"base64","media_type":"application/pdf","data":"` + strings.Repeat("QUJD", 1<<18) + `"}},{"type":"text","text":"sum up"}]}]}`)
	// A 1000 × 750 PNG followed by 1 MB, base64: only its header is decoded.
	png := []byte(`{"model":"m","max_tokens":512,"messages":[{"role":"user","content":[{"type":"image","source":` +
		`{"type":"base64","media_type":"image/png","data":"` +
		base64.StdEncoding.EncodeToString(append(pngBytes(b, 1000, 750), make([]byte, 1<<20)...)) +
		`"}},{"type":"text","text":"describe"}]}]}`)
	for _, bc := range []struct {
		name string
		body []byte
	}{{"Chat", chat}, {"Agent", agent}, {"PDF", pdf}, {"Image", png}} {
		b.Run(bc.name, func(b *testing.B) {
			b.SetBytes(int64(len(bc.body)))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := tokens.Count(tokens.ProviderAnthropic, bc.body); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
