package executor_test

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/deltastream"
	"github.com/llmq/llmq/internal/dispatch"
	"github.com/llmq/llmq/internal/estimator"
	"github.com/llmq/llmq/internal/executor"
	"github.com/llmq/llmq/internal/jobs"
	"github.com/llmq/llmq/internal/jobstest"
	"github.com/llmq/llmq/internal/limiter"
	"github.com/llmq/llmq/internal/llm"
	"github.com/llmq/llmq/internal/llmsim"
	"github.com/llmq/llmq/internal/redistest"
	"github.com/llmq/llmq/internal/retrypolicy"
	"github.com/llmq/llmq/internal/tokens"
)

// A stream that fails partway, by an error event or a cut, after Anthropic's message_start told
// the prompt's input tokens, settles the input-token limit with the provider's count, and the
// estimator learns from it, as an answer does. The estimate (~625 tokens reserved for a prompt
// of ~2,000 characters) is not what the provider counted (llmsim: ~502): a run of failing
// streams settled with estimates keeps the shared limit off by as much each time (and an
// estimator never corrected by them), a cut one kept the whole reservation. A cut stream keeps
// its output reservation: what was generated after message_start is unknown.
func TestExecutor_FailedStreamSettlesProviderInput(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{llmsim.StreamFailError, llmsim.StreamFailCut} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			ctx := t.Context()
			b := jobstest.New(t)
			rdb := redistest.Client(t)
			lim, _ := sharedAdmission(t, rdb)
			p := simProvider(t, llmsim.Config{Faults: llmsim.Faults{StreamFailNext: 1, StreamFailAfter: 2, StreamFailMode: mode}}, "sk-failing")
			// A PriorWeight of 1 token: the one answer all but sets the ratio, as the test reads it.
			est, err := estimator.New(&estimator.Config{PriorWeight: 1})
			require.NoError(t, err)
			limit := limiter.Limit{Rate: 100, Burst: 1, InputTokensPerMinute: 1000, OutputTokensPerMinute: 30}
			gate := lim.Gate("sk-failing", "failing")
			ex := executor.New(executor.Config{Store: b.Store, Policy: retrypolicy.New(nil), Estimator: est,
				Deltas: deltastream.New(deltastream.Config{Redis: rdb, Prefix: redistest.Prefix(t)}),
				Upstreams: map[string]executor.Upstream{"failing": {Name: "failing", Kind: string(llm.KindAnthropic),
					Provider: p, Gate: gate, Limit: limit}}})
			body, err := json.Marshal(map[string]any{"model": "claude-test", "max_tokens": 16, "stream": true,
				"system":   strings.Repeat("a", 2000),
				"messages": []any{map[string]any{"role": "user", "content": "hi"}}})
			require.NoError(t, err)
			_, err = gate.Reserve(ctx, limit) // the request bucket's burst taken: the job's slot is a refill's
			require.NoError(t, err)
			job, _, err := b.Store.Create(ctx, jobs.CreateParams{Tenant: "default", Credential: "failing", Request: body,
				MaxAttempts: 1, Timeout: time.Minute})
			require.NoError(t, err)
			_ = ex.Process(ctx, dispatch.Delivery{JobID: job.ID})
			got, err := b.Store.Get(ctx, job.ID)
			require.NoError(t, err)
			require.Equal(t, jobs.StatusDead, got.Status, "the one attempt failed: %+v", got.LastError)

			// The provider counted ~502 input tokens: ~498 of the minute's 1,000 are left. Settled
			// with the estimate (625), 375 would be.
			r, err := gate.ReserveCost(ctx, limit, tokens.Cost{InputTokens: 480})
			require.NoError(t, err)
			require.True(t, r.Granted)
			require.Less(t, r.Wait, time.Second, "the failed stream's input was settled with the estimate, not the provider's count")
			// Of the output, neither settles a refund: an error event reported none (message_start's
			// output_tokens is a placeholder, and two deltas had come) and a cut stream may have
			// generated more than it reported: each keeps its reservation (max_tokens, 16), as an
			// answer whose usage has no output count does. Refunded, the next requests overspend.
			r, err = gate.ReserveCost(ctx, limit, tokens.Cost{OutputTokens: 20})
			require.NoError(t, err)
			require.Greater(t, r.Wait, time.Second, "the failed stream's unreported output was refunded")
			require.InDelta(t, 1.0, est.Ratio("failing", "default", "claude-test"), 0.05,
				"the estimator did not learn from the provider's count")
		})
	}
}
