package executor_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/clocktest"
	"github.com/llmq/llmq/internal/dispatch"
	"github.com/llmq/llmq/internal/executor"
	"github.com/llmq/llmq/internal/jobs"
	"github.com/llmq/llmq/internal/jobstest"
	"github.com/llmq/llmq/internal/llm"
	"github.com/llmq/llmq/internal/llmsim"
	"github.com/llmq/llmq/internal/retrypolicy"
)

// longRequest is 10 input tokens by llmsim's rule (40 bytes of text), and 16 of output.
var longRequest = json.RawMessage(`{"model":"claude-test","max_tokens":16,"messages":[{"role":"user","content":"` +
	strings.Repeat("abcd", 10) + `"}]}`)

// TestExecutor_ProviderSizeRefusalFailsOver: a request the provider itself refuses as too large
// for the credential (its limits were not configured, so llmq's own estimate let it through) is
// not wrong as such: the job moves to its next fallback, whose model or limits may be larger,
// and is answered there. Each of the providers' ways of saying so: Anthropic's 400 "prompt is too
// long", OpenAI's 400 context_length_exceeded, Anthropic's 413 request_too_large, a compatible
// server's 413, OpenAI's 429 "Request too large for …" (more tokens than the organisation's whole
// tokens-per-minute limit: it was retried as a rate limit, or dead as a spend cap without
// Retry-After, though no wait heals it). The refused call is recorded and counts as an attempt (it was sent), so the move
// needs an attempt left. Without a fallback, or without an attempt left, the job fails as before.
func TestExecutor_ProviderSizeRefusalFailsOver(t *testing.T) {
	t.Parallel()
	b := jobstest.New(t)
	refusals := []struct {
		name   string
		kind   llm.Kind
		small  llmsim.Config // refuses longRequest as too large
		status int
	}{
		{"AnthropicPromptTooLong", llm.KindAnthropic, llmsim.Config{ContextTokens: 5}, http.StatusBadRequest},
		{"OpenAIContextLengthExceeded", llm.KindOpenAI, llmsim.Config{ContextTokens: 5}, http.StatusBadRequest},
		{"AnthropicRequestTooLarge", llm.KindAnthropic,
			llmsim.Config{Faults: llmsim.Faults{FailNext: 1, FailNextStatus: http.StatusRequestEntityTooLarge}},
			http.StatusRequestEntityTooLarge},
		{"Compatible413", llm.KindOpenAI,
			llmsim.Config{Faults: llmsim.Faults{FailNext: 1, FailNextStatus: http.StatusRequestEntityTooLarge}},
			http.StatusRequestEntityTooLarge},
		// 10 input and 16 reserved tokens, more than the whole tokens-per-minute limit of 20.
		{"OpenAIRequestTooLargeForTPM", llm.KindOpenAI, llmsim.Config{InputTokensPerMinute: 20},
			http.StatusTooManyRequests},
	}
	for _, tt := range refusals {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ctx := t.Context()
			// Given a job on "small", which refuses its request as too large, with fallback "large",
			ex := executor.New(executor.Config{Store: b.Store, Upstreams: map[string]executor.Upstream{
				"small": {Name: "small", Kind: string(tt.kind), Provider: simProviderOf(t, tt.kind, tt.small, "sk-small")},
				"large": {Name: "large", Kind: string(tt.kind), Provider: simProviderOf(t, tt.kind, llmsim.Config{}, "sk-large")},
			}})
			job, _, err := b.Store.Create(ctx, jobs.CreateParams{Tenant: "default", Credential: "small",
				Fallbacks: []string{"large"}, Request: longRequest, MaxAttempts: 3, Timeout: time.Hour})
			require.NoError(t, err)
			// when it is delivered, it moves to "large" at once (no backoff),
			perr := ex.Process(ctx, dispatch.Delivery{JobID: job.ID})
			var deferred *dispatch.DeferError
			require.ErrorAs(t, perr, &deferred, "the refusal ended the delivery otherwise")
			got, err := b.Store.Get(ctx, job.ID)
			require.NoError(t, err)
			require.Equal(t, jobs.StatusRetrying, got.Status, "last error: %+v", got.LastError)
			require.Equal(t, "large", got.CurrentCredential())
			require.Nil(t, got.NextAttemptAt, "a backoff was set for a move to another credential")
			// and its next delivery is answered there.
			require.NoError(t, ex.Process(ctx, dispatch.Delivery{JobID: job.ID}))
			got, err = b.Store.Get(ctx, job.ID)
			require.NoError(t, err)
			require.Equal(t, jobs.StatusSucceeded, got.Status, "last error: %+v", got.LastError)
			require.Equal(t, "large", *got.AnsweredBy)
			require.Equal(t, 2, got.Attempts)
			attempts, err := b.Store.Attempts(ctx, job.ID)
			require.NoError(t, err)
			require.Len(t, attempts, 2)
			require.Equal(t, "small", attempts[0].Credential)
			require.Equal(t, string(retrypolicy.ClassPermanent), attempts[0].Class)
			require.Equal(t, tt.status, *attempts[0].StatusCode)
		})
	}

	// ends runs a job of longRequest on a credential that refuses it, with fallbacks and
	// maxAttempts, and requires that it fails in one delivery, as a permanent error does.
	ends := func(t *testing.T, fallbacks []string, maxAttempts int) {
		t.Helper()
		ctx := t.Context()
		ex := executor.New(executor.Config{Store: b.Store, Upstreams: map[string]executor.Upstream{
			"small": {Name: "small", Kind: string(llm.KindAnthropic),
				Provider: simProviderOf(t, llm.KindAnthropic, llmsim.Config{ContextTokens: 5}, "sk-small")},
			"large": {Name: "large", Kind: string(llm.KindAnthropic),
				Provider: simProviderOf(t, llm.KindAnthropic, llmsim.Config{}, "sk-large")},
		}})
		job, _, err := b.Store.Create(ctx, jobs.CreateParams{Tenant: "default", Credential: "small",
			Fallbacks: fallbacks, Request: longRequest, MaxAttempts: maxAttempts, Timeout: time.Hour})
		require.NoError(t, err)
		require.NoError(t, ex.Process(ctx, dispatch.Delivery{JobID: job.ID}))
		got, err := b.Store.Get(ctx, job.ID)
		require.NoError(t, err)
		require.Equal(t, jobs.StatusFailed, got.Status)
		require.Equal(t, &jobs.LastError{Class: string(retrypolicy.ClassPermanent), Status: http.StatusBadRequest,
			Type: "invalid_request_error", Message: "prompt is too long: 10 tokens > 5 maximum"}, got.LastError)
		require.Equal(t, 1, got.Attempts)
		require.Equal(t, "small", got.CurrentCredential())
	}
	t.Run("NoFallback", func(t *testing.T) {
		t.Parallel()
		ends(t, nil, 3)
	})
	t.Run("NoAttemptLeft", func(t *testing.T) {
		t.Parallel()
		ends(t, []string{"large"}, 1)
	})

	// A refusal that comes after the job's deadline (the call took that long) moves nothing: the
	// job fails with the provider's answer, and its client sees no retrying event after its
	// timeout (as for a call the deadline cut, TestExecutor_CallCutByTheDeadlineFailsTheJob).
	t.Run("DeadlinePassedDuringTheCall", func(t *testing.T) {
		t.Parallel()
		ctx := t.Context()
		clock := clocktest.New(time.Now())
		sim := llmsim.New(llmsim.Config{ContextTokens: 5})
		slow := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			clock.Advance(2 * time.Hour) // the call outlives the job's hour
			sim.ServeHTTP(w, r)
		}))
		t.Cleanup(slow.Close)
		small, err := llm.New(llm.Config{Kind: llm.KindAnthropic, BaseURL: slow.URL, APIKey: "sk-small"})
		require.NoError(t, err)
		ex := executor.New(executor.Config{Store: b.Store, Now: clock.Now, Upstreams: map[string]executor.Upstream{
			"small": {Name: "small", Kind: string(llm.KindAnthropic), Provider: small},
			"large": {Name: "large", Kind: string(llm.KindAnthropic),
				Provider: simProviderOf(t, llm.KindAnthropic, llmsim.Config{}, "sk-large")},
		}})
		job, _, err := b.Store.Create(ctx, jobs.CreateParams{Tenant: "default", Credential: "small",
			Fallbacks: []string{"large"}, Request: longRequest, MaxAttempts: 3, Timeout: time.Hour})
		require.NoError(t, err)
		require.NoError(t, ex.Process(ctx, dispatch.Delivery{JobID: job.ID}))
		got, err := b.Store.Get(ctx, job.ID)
		require.NoError(t, err)
		require.Equal(t, jobs.StatusFailed, got.Status, "last error: %+v", got.LastError)
		require.Equal(t, "small", got.CurrentCredential())
		require.Equal(t, "prompt is too long: 10 tokens > 5 maximum", got.LastError.Message)
	})
}
