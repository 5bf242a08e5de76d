package api

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/tokens"
)

// TestSubmit_TooLargeForSomeCredentialsOfTheChain: a worker fails a request too large for a
// credential's token limits over to the job's next fallback, so the check at submit refuses
// only a request that no credential of the chain can take: every one has a configured limit it
// exceeds. A fallback able to take it, or a credential whose limits are not configured (learned
// from the provider), lets it in (it was refused as soon as one credential was too small).
func TestSubmit_TooLargeForSomeCredentialsOfTheChain(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{credentials: []string{"small", "smaller", "large", "unknown"},
		kinds: map[string]string{"small": tokens.ProviderAnthropic,
			"smaller": tokens.ProviderAnthropic, "large": tokens.ProviderAnthropic,
			"unknown": tokens.ProviderAnthropic},
		tokenLimits: map[string]tokens.Limits{"small": {OutputPerMinute: 1000},
			"smaller": {OutputPerMinute: 500}, "large": {OutputPerMinute: 100000}}})
	const req = `"request":{"model":"m","max_tokens":2000,` +
		`"messages":[{"role":"user","content":"hi"}]}`
	for _, tc := range []struct{ name, chain string }{
		{"FallbackFits", `"credential":"small","fallbacks":["smaller","large"]`},
		{"PrimaryFits", `"credential":"large","fallbacks":["small"]`},
		{"FallbackUnconfigured", `"credential":"small","fallbacks":["unknown"]`},
		{"PrimaryUnconfigured", `"credential":"unknown","fallbacks":["small"]`},
	} {
		r := b.do(t, "POST", "/v1/jobs", `{`+tc.chain+`,`+req+`}`, nil)
		require.Equal(t, 202, r.status, "%s: %v", tc.name, r.body)
	}
	for _, tc := range []struct{ name, chain, msg string }{
		{"NoFallback", `"credential":"small"`,
			`credential "small": request needs 2000 output tokens`},
		{"NoFallbackFits", `"credential":"small","fallbacks":["smaller"]`,
			`credential "small" (and every fallback): request needs 2000 output tokens`},
	} {
		r := b.do(t, "POST", "/v1/jobs", `{`+tc.chain+`,`+req+`}`, nil)
		require.Equal(t, 400, r.status, "%s: %v", tc.name, r.body)
		e := r.body["error"].(map[string]any)
		require.Equal(t, "request_too_large", e["type"], tc.name)
		require.Contains(t, e["message"], tc.msg, tc.name)
	}
	require.Equal(t, 4, countJobs(t, b, "default"))
}
