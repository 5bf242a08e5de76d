package limiter_test

import (
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/limiter"
)

func TestObservationFromHeaders(t *testing.T) {
	t.Parallel()
	sent := t0.Add(100 * time.Millisecond)
	at := t0.Add(400 * time.Millisecond)
	hdr := func(kv ...string) http.Header {
		h := http.Header{}
		for i := 0; i < len(kv); i += 2 {
			h.Set(kv[i], kv[i+1])
		}
		return h
	}
	for _, tc := range []struct {
		name string
		h    http.Header
		code int
		want limiter.Observation
	}{
		{
			name: "Anthropic",
			h: hdr(limiter.HeaderAnthropicLimit, "50", limiter.HeaderAnthropicRemaining, "49",
				limiter.HeaderAnthropicReset, "2030-01-01T12:00:01Z"),
			code: 200,
			want: limiter.Observation{HeadersKnown: true, Limit: 50, Remaining: 49,
				ResetAt: t0.Add(time.Second), ResetAbsolute: true},
		},
		{
			name: "AnthropicNanos",
			h: hdr(limiter.HeaderAnthropicLimit, "50", limiter.HeaderAnthropicRemaining, "0",
				limiter.HeaderAnthropicReset, "2030-01-01T12:00:01.25Z"),
			code: 200,
			want: limiter.Observation{HeadersKnown: true, Limit: 50, ResetAt: t0.Add(1250 * time.Millisecond),
				ResetAbsolute: true},
		},
		{
			name: "OpenAIMillis",
			h: hdr(limiter.HeaderOpenAILimit, "5000", limiter.HeaderOpenAIRemaining, "4999",
				limiter.HeaderOpenAIReset, "12ms"),
			code: 200,
			want: limiter.Observation{HeadersKnown: true, Limit: 5000, Remaining: 4999,
				ResetAt: at.Add(12 * time.Millisecond), ResetGranularity: time.Millisecond},
		},
		{
			name: "OpenAIMinutes",
			h: hdr(limiter.HeaderOpenAILimit, "60", limiter.HeaderOpenAIRemaining, "0",
				limiter.HeaderOpenAIReset, "6m0s"),
			code: 200,
			want: limiter.Observation{HeadersKnown: true, Limit: 60, ResetAt: at.Add(6 * time.Minute),
				ResetGranularity: time.Second},
		},
		{
			name: "RetryAfterSeconds",
			h:    hdr("Retry-After", "3"),
			code: 429,
			want: limiter.Observation{RetryAfter: 3 * time.Second, HasRetryAfter: true},
		},
		{
			name: "RetryAfterDate",
			h:    hdr("Retry-After", "Tue, 01 Jan 2030 12:00:02 GMT"),
			code: 429,
			want: limiter.Observation{RetryAfter: 1600 * time.Millisecond, HasRetryAfter: true},
		},
		{
			name: "RetryAfterMsWins",
			h:    hdr("Retry-After", "1", limiter.HeaderRetryAfterMs, "250.5"),
			code: 429,
			want: limiter.Observation{RetryAfter: 250500 * time.Microsecond, HasRetryAfter: true},
		},
		{
			name: "Malformed",
			h: hdr(limiter.HeaderAnthropicLimit, "lots", limiter.HeaderAnthropicRemaining, "1",
				limiter.HeaderAnthropicReset, "soon", "Retry-After", "later"),
			code: 429,
			want: limiter.Observation{},
		},
		{
			name: "ResetMissing",
			h:    hdr(limiter.HeaderOpenAILimit, "60", limiter.HeaderOpenAIRemaining, "3"),
			code: 200,
			want: limiter.Observation{},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got := limiter.ObservationFromHeaders(tc.h, tc.code, sent, at)
			want := tc.want
			want.At, want.SentAt, want.StatusCode = at, sent, tc.code
			require.True(t, want.ResetAt.Equal(got.ResetAt), "ResetAt %v, want %v", got.ResetAt, want.ResetAt)
			got.ResetAt = want.ResetAt
			require.Equal(t, want, got)
		})
	}
}
