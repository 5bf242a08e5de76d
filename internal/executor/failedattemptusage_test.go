package executor_test

import (
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/dispatch"
	"github.com/llmq/llmq/internal/executor"
	"github.com/llmq/llmq/internal/jobs"
	"github.com/llmq/llmq/internal/jobstest"
	"github.com/llmq/llmq/internal/llm"
	"github.com/llmq/llmq/internal/llmsim"
	"github.com/llmq/llmq/internal/retrypolicy"
)

// A stream that failed partway after Anthropic's message_start had reported the prompt's input
// tokens left its attempt's row without usage: what that attempt cost was seen nowhere (ctl dead
// show --json, the console's attempts), though the executor had it (llm.FailedUsage). The failed
// attempt's row keeps what the provider reported; the job's usage stays its answer's alone.
func TestExecutor_FailedAttemptKeepsItsUsage(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{llmsim.StreamFailError, llmsim.StreamFailCut} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			ctx := t.Context()
			b := jobstest.New(t)
			p := simProvider(t, llmsim.Config{Faults: llmsim.Faults{StreamFailNext: 1, StreamFailAfter: 2, StreamFailMode: mode}}, "sk-partial")
			ex := executor.New(executor.Config{Store: b.Store,
				// No backoff: the retry is due at once.
				Policy:    retrypolicy.New(&retrypolicy.Config{Float64: func() float64 { return 0 }}),
				Upstreams: map[string]executor.Upstream{"partial": {Name: "partial", Kind: string(llm.KindAnthropic), Provider: p}}})
			body := json.RawMessage(`{"model":"claude-test","max_tokens":16,"stream":true,"messages":[{"role":"user","content":"hi"}]}`)
			job, _, err := b.Store.Create(ctx, jobs.CreateParams{Tenant: "default", Credential: "partial", Request: body,
				MaxAttempts: 2, Timeout: time.Minute})
			require.NoError(t, err)

			// When the first attempt's stream fails after message_start, and the second is answered
			var de *dispatch.DeferError
			require.True(t, errors.As(ex.Process(ctx, dispatch.Delivery{JobID: job.ID}), &de), "the failed stream is retried")
			require.NoError(t, ex.Process(ctx, dispatch.Delivery{JobID: job.ID, Retried: 0}))
			got, err := b.Store.Get(ctx, job.ID)
			require.NoError(t, err)
			require.Equal(t, jobs.StatusSucceeded, got.Status, "%+v", got.LastError)

			// Then the failed attempt's row holds the usage its stream reported
			attempts, err := b.Store.Attempts(ctx, job.ID)
			require.NoError(t, err)
			require.Len(t, attempts, 2)
			require.NotEqual(t, string(retrypolicy.ClassOK), attempts[0].Class)
			require.NotNil(t, attempts[0].Usage, "the failed attempt's row has no usage")
			var partial llm.Usage
			require.NoError(t, json.Unmarshal(attempts[0].Usage, &partial))
			require.Positive(t, partial.InputTokens, "the failed attempt's usage: %s", attempts[0].Usage)
			// And the job's usage is its answer's, the answered attempt's
			require.JSONEq(t, string(attempts[1].Usage), string(got.Usage))
			var answered llm.Usage
			require.NoError(t, json.Unmarshal(got.Usage, &answered))
			require.Positive(t, answered.OutputTokens)
			require.NotEqual(t, partial, answered, "the failed attempt's usage became the job's")
		})
	}
}

// A failed attempt's partial usage does not become the usage of a job that ends without an
// answer: the job's usage is what its answer cost, and it has none.
func TestExecutor_FailedAttemptUsageIsNotTheJobs(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := jobstest.New(t)
	p := simProvider(t, llmsim.Config{Faults: llmsim.Faults{StreamFailNext: 1, StreamFailAfter: 2}}, "sk-partial")
	ex := executor.New(executor.Config{Store: b.Store,
		Upstreams: map[string]executor.Upstream{"partial": {Name: "partial", Kind: string(llm.KindAnthropic), Provider: p}}})
	body := json.RawMessage(`{"model":"claude-test","max_tokens":16,"stream":true,"messages":[{"role":"user","content":"hi"}]}`)
	job, _, err := b.Store.Create(ctx, jobs.CreateParams{Tenant: "default", Credential: "partial", Request: body,
		MaxAttempts: 1, Timeout: time.Minute})
	require.NoError(t, err)

	require.NoError(t, ex.Process(ctx, dispatch.Delivery{JobID: job.ID}))

	got, err := b.Store.Get(ctx, job.ID)
	require.NoError(t, err)
	require.True(t, got.Status.Terminal())
	require.NotEqual(t, jobs.StatusSucceeded, got.Status)
	require.Nil(t, got.Usage, "a failed attempt's usage became the job's")
	attempts, err := b.Store.Attempts(ctx, job.ID)
	require.NoError(t, err)
	require.Len(t, attempts, 1)
	require.NotNil(t, attempts[0].Usage, "the failed attempt's row has no usage")
}
