package llm_test

import (
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/llm"
)

// TestProvider_Send_RateLimitHeaderNamesOnTheWire: the rate-limit headers are read by their
// canonical names from the response's header map (not through Header.Get), so this proves that
// whatever spelling a provider or a proxy puts on the wire reaches them: net/http's HTTP/1.1
// client canonicalises each name it reads, and HTTP/2 (names always lower case on the wire)
// does too. The server writes the names raw (lower and upper case), past Header.Set.
func TestProvider_Send_RateLimitHeaderNamesOnTheWire(t *testing.T) {
	t.Parallel()

	headers := map[llm.Kind][]string{
		llm.KindAnthropic: {"anthropic-ratelimit-requests-limit", "50", "ANTHROPIC-RATELIMIT-REQUESTS-REMAINING", "49",
			"anthropic-RateLimit-requests-reset", "2026-03-01T12:00:30Z",
			"anthropic-ratelimit-input-tokens-limit", "1000", "anthropic-ratelimit-input-tokens-remaining", "900",
			"anthropic-ratelimit-output-tokens-limit", "2000", "anthropic-ratelimit-output-tokens-remaining", "1900",
			"anthropic-ratelimit-tokens-limit", "3000", "anthropic-ratelimit-tokens-remaining", "2900", "date",
			testNow.Format(http.TimeFormat)},
		llm.KindOpenAI: {"x-ratelimit-limit-requests", "60", "X-RATELIMIT-REMAINING-REQUESTS", "59",
			"x-ratelimit-reset-requests", "1s", "x-ratelimit-limit-tokens", "1000", "x-ratelimit-remaining-tokens", "900",
			"x-RateLimit-reset-tokens", "2s"},
	}
	for _, proto := range []string{"HTTP/1.1", "HTTP/2.0"} {
		for kind, kv := range headers {
			t.Run(proto+"/"+string(kind), func(t *testing.T) {
				t.Parallel()

				seen := make(chan string, 1)
				srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					select {
					case seen <- r.Proto:
					default:
					}
					for i := 0; i < len(kv); i += 2 {
						w.Header()[kv[i]] = []string{kv[i+1]} // the name as written, not canonicalised
					}
					w.Header().Set("Content-Type", "application/json")
					_, _ = w.Write([]byte(`{}`))
				}))
				srv.EnableHTTP2 = strings.HasPrefix(proto, "HTTP/2")
				srv.StartTLS()
				t.Cleanup(srv.Close)
				p, err := llm.New(llm.Config{Kind: kind, BaseURL: srv.URL, APIKey: testKey, HTTPClient: srv.Client(),
					Now: fixedClock})
				require.NoError(t, err)

				resp, err := p.Send(callContext(t), bodyFor(kind), llm.SendOptions{})
				require.NoError(t, err)
				require.Equal(t, proto, within(t, seen, "the request"))
				rl := resp.RateLimit
				require.True(t, rl.Known, "%+v", rl)
				require.Equal(t, kv[1]+"/"+kv[3], strconv.Itoa(rl.Limit)+"/"+strconv.Itoa(rl.Remaining))
				require.False(t, rl.ResetAt.IsZero(), "reset")
				require.True(t, rl.Tokens.Combined.Known, "%+v", rl.Tokens)
				if kind == llm.KindAnthropic {
					require.True(t, rl.Tokens.Input.Known && rl.Tokens.Output.Known, "%+v", rl.Tokens)
					require.True(t, rl.Date.Equal(testNow), "Date: %v", rl.Date)
				} else {
					require.False(t, rl.Tokens.Combined.ResetAt.IsZero(), "token reset")
				}
			})
		}
	}
}
