package llm_test

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/llm"
	"github.com/llmq/llmq/internal/llmsim"
	"github.com/llmq/llmq/internal/retrypolicy"
)

// TestClassify_LLMErrors proves that the errors of this package carry what retrypolicy
// looks for, end to end over HTTP.
func TestClassify_LLMErrors(t *testing.T) {
	t.Parallel()

	const spendCap = retrypolicy.DeadReasonRateLimitedNoRetryAfter
	tests := []struct {
		name    string
		kind    llm.Kind
		handler http.HandlerFunc
		want    retrypolicy.Decision
	}{
		{"OK", llm.KindAnthropic, reply(200, `{}`), retrypolicy.Decision{Class: retrypolicy.ClassOK}},
		{"400", llm.KindAnthropic, reply(400, `{"type":"error","error":{"type":"invalid_request_error","message":"bad"}}`),
			retrypolicy.Decision{Class: retrypolicy.ClassPermanent, StatusCode: 400}},
		{"401", llm.KindOpenAI, reply(401, `{"error":{"message":"no","type":"invalid_request_error","code":"invalid_api_key"}}`),
			retrypolicy.Decision{Class: retrypolicy.ClassPermanent, StatusCode: 401}},
		{"429RetryAfter", llm.KindAnthropic, reply(429, `{"type":"error","error":{"type":"rate_limit_error","message":"slow down"}}`, "Retry-After", "3"),
			retrypolicy.Decision{Class: retrypolicy.ClassRateLimited, Retry: true, StatusCode: 429, RetryAfter: 3 * time.Second, HasRetryAfter: true}},
		{"429RetryAfterMs", llm.KindOpenAI, reply(429, `{"error":{"message":"slow down","type":"requests","code":"rate_limit_exceeded"}}`, "Retry-After-Ms", "1500", "Retry-After", "2"),
			retrypolicy.Decision{Class: retrypolicy.ClassRateLimited, Retry: true, StatusCode: 429, RetryAfter: 1500 * time.Millisecond, HasRetryAfter: true}},
		{"429NoRetryAfter", llm.KindAnthropic, reply(429, `{"type":"error","error":{"type":"rate_limit_error","message":"limit"}}`),
			retrypolicy.Decision{Class: retrypolicy.ClassSpendCap, DeadReason: spendCap, StatusCode: 429}},
		{"429MalformedRetryAfter", llm.KindAnthropic, reply(429, `{"type":"error","error":{"type":"rate_limit_error","message":"later"}}`, "Retry-After", "-5"),
			retrypolicy.Decision{Class: retrypolicy.ClassRetryable, Retry: true, StatusCode: 429, MalformedRetryAfter: true, RetryAfterValue: "-5"}},
		{"429EmptyRetryAfter", llm.KindOpenAI, reply(429, `{"error":{"message":"later","type":"requests"}}`, "Retry-After", ""),
			retrypolicy.Decision{Class: retrypolicy.ClassRetryable, Retry: true, StatusCode: 429, MalformedRetryAfter: true}},
		{"429AnthropicSpendLimit", llm.KindAnthropic, reply(429, `{"type":"error","error":{"type":"rate_limit_error","message":"spend","details":{"error_code":"enforced_spend_limit_reached"}}}`, "X-Should-Retry", "true"),
			retrypolicy.Decision{Class: retrypolicy.ClassSpendCap, DeadReason: spendCap, StatusCode: 429}},
		{"429OpenAIInsufficientQuota", llm.KindOpenAI, reply(429, `{"error":{"message":"quota","type":"insufficient_quota","param":null,"code":"insufficient_quota"}}`),
			retrypolicy.Decision{Class: retrypolicy.ClassSpendCap, DeadReason: spendCap, StatusCode: 429}},
		{"503", llm.KindOpenAI, reply(503, "busy", "Content-Type", "text/plain"),
			retrypolicy.Decision{Class: retrypolicy.ClassRetryable, Retry: true, StatusCode: 503}},
		{"529", llm.KindAnthropic, reply(529, `{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}`),
			retrypolicy.Decision{Class: retrypolicy.ClassRetryable, Retry: true, StatusCode: 529}},
		{"ShouldRetryTrueOn400", llm.KindAnthropic, reply(400, `{}`, "X-Should-Retry", "true"),
			retrypolicy.Decision{Class: retrypolicy.ClassRetryable, Retry: true, StatusCode: 400}},
		{"ShouldRetryFalseOn503", llm.KindAnthropic, reply(503, `{}`, "X-Should-Retry", "false"),
			retrypolicy.Decision{Class: retrypolicy.ClassPermanent, StatusCode: 503}},
		{"413AnthropicRequestTooLarge", llm.KindAnthropic, reply(413, `{"type":"error","error":{"type":"request_too_large","message":"Request exceeds the maximum allowed number of bytes."}}`, "X-Should-Retry", "false"),
			retrypolicy.Decision{Class: retrypolicy.ClassPermanent, StatusCode: 413, TooLarge: true}},
		{"413Compatible", llm.KindOpenAI, reply(413, "Payload Too Large", "Content-Type", "text/plain"),
			retrypolicy.Decision{Class: retrypolicy.ClassPermanent, StatusCode: 413, TooLarge: true}},
		{"400OpenAIContextLengthExceeded", llm.KindOpenAI, reply(400, `{"error":{"message":"This model's maximum context length is 8192 tokens. However, your messages resulted in 9000 tokens.","type":"invalid_request_error","param":"messages","code":"context_length_exceeded"}}`),
			retrypolicy.Decision{Class: retrypolicy.ClassPermanent, StatusCode: 400, TooLarge: true}},
		{"400AnthropicPromptTooLong", llm.KindAnthropic, reply(400, `{"type":"error","error":{"type":"invalid_request_error","message":"prompt is too long: 209353 tokens > 199999 maximum"}}`),
			retrypolicy.Decision{Class: retrypolicy.ClassPermanent, StatusCode: 400, TooLarge: true}},
		{"413ShouldRetryTrueIsRetriedHere", llm.KindAnthropic, reply(413, `{"type":"error","error":{"type":"request_too_large","message":"too large"}}`, "X-Should-Retry", "true"),
			retrypolicy.Decision{Class: retrypolicy.ClassRetryable, Retry: true, StatusCode: 413}},
		{"400AnthropicMaxTokensIsNotTooLarge", llm.KindAnthropic, reply(400, `{"type":"error","error":{"type":"invalid_request_error","message":"max_tokens: 10000 > 4096, which is the maximum allowed number of output tokens for claude-3-5-sonnet-20240620"}}`),
			retrypolicy.Decision{Class: retrypolicy.ClassPermanent, StatusCode: 400}},
		{"429NotTooLargeForPromptText", llm.KindAnthropic, reply(429, `{"type":"error","error":{"type":"rate_limit_error","message":"prompt is too long"}}`, "Retry-After", "1"),
			retrypolicy.Decision{Class: retrypolicy.ClassRateLimited, Retry: true, StatusCode: 429, RetryAfter: time.Second, HasRetryAfter: true}},
		// OpenAI's refusal of a request larger than the organisation's whole tokens-per-minute
		// limit: a 429 that never heals, with its rate-limit headers or without.
		{"429OpenAIRequestTooLargeForTPM", llm.KindOpenAI, reply(429, `{"error":{"message":"Request too large for gpt-4o in organization org-x on tokens per min (TPM): Limit 30000, Requested 50000. The input or output tokens must be reduced in order to run successfully. Visit https://platform.openai.com/account/rate-limits to learn more.","type":"tokens","param":null,"code":"rate_limit_exceeded"}}`),
			retrypolicy.Decision{Class: retrypolicy.ClassPermanent, StatusCode: 429, TooLarge: true}},
		{"429OpenAIRequestTooLargeWithRetryAfter", llm.KindOpenAI, reply(429, `{"error":{"message":"Request too large for gpt-4.1-2025-04-14 (for limit gpt-4.1) in organization org-x on tokens per min (TPM): Limit 30000, Requested 37313. The input or output tokens must be reduced in order to run successfully.","type":"tokens","param":null,"code":"rate_limit_exceeded"}}`, "Retry-After", "2", "X-Should-Retry", "true"),
			retrypolicy.Decision{Class: retrypolicy.ClassPermanent, StatusCode: 429, TooLarge: true, RetryAfter: 2 * time.Second, HasRetryAfter: true}},
		// The same words for a request that fits the limit (OpenAI has sent them for one of 546
		// tokens under a limit of 250000): a rate limit as any other.
		{"429OpenAIRequestTooLargeThatFits", llm.KindOpenAI, reply(429, `{"error":{"message":"Request too large for organization org-x on tokens per min (TPM): Limit 250000, Requested 546. The input or output tokens must be reduced in order to run successfully.","type":"tokens","param":null,"code":"rate_limit_exceeded"}}`, "Retry-After", "1"),
			retrypolicy.Decision{Class: retrypolicy.ClassRateLimited, Retry: true, StatusCode: 429, RetryAfter: time.Second, HasRetryAfter: true}},
		{"400NotTooLargeForOpenAITPMText", llm.KindOpenAI, reply(400, `{"error":{"message":"Request too large for gpt-4o in organization org-x on tokens per min (TPM): Limit 30000, Requested 50000.","type":"invalid_request_error"}}`),
			retrypolicy.Decision{Class: retrypolicy.ClassPermanent, StatusCode: 400}},
		{"Redirect", llm.KindAnthropic, func(w http.ResponseWriter, r *http.Request) { http.Redirect(w, r, "/elsewhere", http.StatusFound) },
			retrypolicy.Decision{Class: retrypolicy.ClassPermanent, StatusCode: 302}},
		{"DecodeError", llm.KindAnthropic, reply(200, "<html>", "Content-Type", "text/html"),
			retrypolicy.Decision{Class: retrypolicy.ClassInternal}},
		{"BodyCutShort", llm.KindOpenAI, func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Length", "100")
			w.WriteHeader(200)
			_, _ = io.WriteString(w, "{")
			// Flushed first: a hijack drops what the handler's buffered writer holds.
			rc := http.NewResponseController(w)
			if rc.Flush() != nil {
				return
			}
			if conn, _, err := rc.Hijack(); err == nil {
				_ = conn.Close()
			}
		}, retrypolicy.Decision{Class: retrypolicy.ClassNetwork, Retry: true}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()

			b := setup(t, tt.kind, tt.handler)
			_, err := b.provider.Send(t.Context(), bodyFor(tt.kind), llm.SendOptions{})
			require.Equal(t, tt.want, retrypolicy.Classify(err, time.Now()), "err: %v", err)
		})
	}

	// A refusal for size inside a stream the provider had begun to answer is no refusal of the
	// request: its status (413, the error type's) must not move the job to a fallback.
	t.Run("MidStreamRequestTooLargeIsNotTooLarge", func(t *testing.T) {
		t.Parallel()

		b := setup(t, llm.KindAnthropic, reply(200, "event: message_start\n"+
			`data: {"type":"message_start","message":{"id":"m","type":"message","role":"assistant","model":"c",`+
			`"content":[],"usage":{"input_tokens":3,"output_tokens":1}}}`+"\n\nevent: error\n"+
			`data: {"type":"error","error":{"type":"request_too_large","message":"prompt is too long"}}`+"\n\n",
			"Content-Type", "text/event-stream"))
		_, err := b.provider.Send(t.Context(), streamBody(llm.KindAnthropic), llm.SendOptions{OnDelta: func(llm.Delta) {}})
		var se *llm.StatusError
		require.ErrorAs(t, err, &se)
		require.True(t, se.MidStream, "err: %v", err)
		require.Equal(t, retrypolicy.Decision{Class: retrypolicy.ClassPermanent, StatusCode: 413}, retrypolicy.Classify(err, time.Now()))
	})

	// A streamed request refused before its stream begins is refused as a whole one is.
	t.Run("StreamRefusedBeforeItBeginsIsTooLarge", func(t *testing.T) {
		t.Parallel()

		for _, kind := range []llm.Kind{llm.KindAnthropic, llm.KindOpenAI} {
			p, _ := simProvider(t, kind, llmsim.Config{ContextTokens: 1})
			_, err := p.Send(t.Context(), streamBody(kind), llm.SendOptions{OnDelta: func(llm.Delta) {}})
			require.Equal(t, retrypolicy.Decision{Class: retrypolicy.ClassPermanent, StatusCode: 400, TooLarge: true},
				retrypolicy.Classify(err, time.Now()), "%s: %v", kind, err)
		}
	})

	t.Run("InvalidRequestIsInternal", func(t *testing.T) {
		t.Parallel()

		b := setup(t, llm.KindAnthropic, reply(200, `{}`))
		_, err := b.provider.Send(t.Context(), []byte("[]"), llm.SendOptions{})
		require.Equal(t, retrypolicy.Decision{Class: retrypolicy.ClassInternal}, retrypolicy.Classify(err, time.Now()))
	})

	t.Run("ConnectionRefusedIsNetwork", func(t *testing.T) {
		t.Parallel()

		b := setup(t, llm.KindOpenAI, reply(200, `{}`))
		b.srv.Close()
		_, err := b.provider.Send(t.Context(), bodyFor(llm.KindOpenAI), llm.SendOptions{})
		require.Equal(t, retrypolicy.Decision{Class: retrypolicy.ClassNetwork, Retry: true}, retrypolicy.Classify(err, time.Now()))
	})

	t.Run("DeadlineIsTimeout", func(t *testing.T) {
		t.Parallel()

		b, _, _ := blockingServer(t, llm.KindAnthropic, false)
		ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
		defer cancel()
		_, err := b.provider.Send(ctx, bodyFor(llm.KindAnthropic), llm.SendOptions{})
		require.Equal(t, retrypolicy.Decision{Class: retrypolicy.ClassTimeout, Retry: true}, retrypolicy.Classify(err, time.Now()))
	})

	t.Run("CancelIsCanceled", func(t *testing.T) {
		t.Parallel()

		b, ready, _ := blockingServer(t, llm.KindAnthropic, true)
		ctx, cancel := context.WithCancel(callContext(t))
		errc := make(chan error, 1)
		go func() {
			_, err := b.provider.Send(ctx, bodyFor(llm.KindAnthropic), llm.SendOptions{})
			errc <- err
		}()
		within(t, ready, "request at the server")
		cancel()
		err := within(t, errc, "end of the canceled call")
		require.Equal(t, retrypolicy.Decision{Class: retrypolicy.ClassCanceled}, retrypolicy.Classify(err, time.Now()))
	})

	t.Run("DelayHonoursProviderRetryAfter", func(t *testing.T) {
		t.Parallel()

		b := setup(t, llm.KindAnthropic, reply(429, `{"type":"error","error":{"type":"rate_limit_error","message":"x"}}`, "Retry-After", "4"))
		_, err := b.provider.Send(t.Context(), bodyFor(llm.KindAnthropic), llm.SendOptions{})
		d := retrypolicy.Classify(err, time.Now())
		p := retrypolicy.New(&retrypolicy.Config{Float64: func() float64 { return 0.5 }})
		require.Equal(t, 4*time.Second+500*time.Millisecond, p.Delay(1, d))
		require.False(t, strings.Contains(err.Error(), testKey))
	})
}
