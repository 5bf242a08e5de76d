package api

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/tokens"
)

// TestSubmit_ChoicesAndIntegralMaxTokens: OpenAI's n multiplies the output a request can use, so
// the token check at submit counts max_tokens × n; an n it cannot count goes to the provider, which
// judges it, and one in another case is a 400 naming it. max_tokens 4096.0
// is 4096, as the providers read it, not an uncountable body.
func TestSubmit_ChoicesAndIntegralMaxTokens(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{credentials: []string{"oai", "claude"},
		kinds:       map[string]string{"oai": tokens.ProviderOpenAI, "claude": tokens.ProviderAnthropic},
		tokenLimits: map[string]tokens.Limits{"oai": {CombinedPerMinute: 1000}, "claude": {OutputPerMinute: 1000}}})
	const msgs = `"messages":[{"role":"user","content":"hi"}]`

	for _, tc := range []struct{ name, body string }{
		{"NAbsent", `{"credential":"oai","request":{"model":"m","max_tokens":400,` + msgs + `}}`},
		{"NOne", `{"credential":"oai","request":{"model":"m","max_tokens":400,"n":1,` + msgs + `}}`},
		{"NTwo", `{"credential":"oai","request":{"model":"m","max_tokens":400,"n":2,` + msgs + `}}`},
		// Anthropic has no n: the provider judges it, and it reserves nothing more.
		{"AnthropicN", `{"credential":"claude","request":{"model":"m","max_tokens":400,"n":3,` + msgs + `}}`},
		// An n that is not an integer from 1 to 128 cannot be counted: the provider judges it (and
		// refuses it before any token is used), as a max_tokens that cannot be read.
		{"NZero", `{"credential":"oai","request":{"model":"m","max_tokens":4,"n":0,` + msgs + `}}`},
		{"NTooMany", `{"credential":"oai","request":{"model":"m","max_tokens":4,"n":129,` + msgs + `}}`},
		{"NString", `{"credential":"oai","request":{"model":"m","max_tokens":4,"n":"3",` + msgs + `}}`},
		{"NFraction", `{"credential":"oai","request":{"model":"m","max_tokens":4,"n":1.5,` + msgs + `}}`},
	} {
		r := b.do(t, "POST", "/v1/jobs", tc.body, nil)
		require.Equal(t, 202, r.status, "%s: %v", tc.name, r.body)
	}
	for _, tc := range []struct{ name, body, typ, msg string }{
		{"NThreeTooLarge", `{"credential":"oai","request":{"model":"m","max_tokens":400,"n":3,` + msgs + `}}`,
			"request_too_large", "request needs 1201 input + output tokens"},
		{"NCase", `{"credential":"oai","request":{"model":"m","max_tokens":4,"N":3,` + msgs + `}}`,
			"invalid_request", `field "request.N" must be spelled "n"`},
		{"IntegralFloatMaxTokens", `{"credential":"claude","request":{"model":"m","max_tokens":4096.0,` + msgs + `}}`,
			"request_too_large", "request needs 4096 output tokens"},
	} {
		r := b.do(t, "POST", "/v1/jobs", tc.body, nil)
		require.Equal(t, 400, r.status, "%s: %v", tc.name, r.body)
		e := r.body["error"].(map[string]any)
		require.Equal(t, tc.typ, e["type"], tc.name)
		require.Contains(t, e["message"], tc.msg, tc.name)
	}
	require.Equal(t, 8, countJobs(t, b, "default"))
}
