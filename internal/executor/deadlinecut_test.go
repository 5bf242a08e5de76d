package executor_test

import (
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

// A call that the job's own deadline cuts (the provider hangs past it) fails the job,
// deadline_exceeded: its last attempt does not dead-letter it as retries_exhausted (an operator's
// alert, and a `ctl dead retry --all` candidate, for a client's timeout), and a job with a
// fallback does not fail over to it after its deadline, a retrying event the client would see
// after its timeout.
func TestExecutor_CallCutByTheDeadlineFailsTheJob(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := jobstest.New(t)
	hang := simProvider(t, llmsim.Config{Faults: llmsim.Faults{Hang: true}}, "sk-hang")
	ex := executor.New(executor.Config{Store: b.Store, Policy: retrypolicy.New(nil),
		Upstreams: map[string]executor.Upstream{
			"main":   {Name: "main", Kind: string(llm.KindAnthropic), Provider: hang},
			"backup": {Name: "backup", Kind: string(llm.KindAnthropic), Provider: hang},
		}})

	for _, c := range []struct {
		name        string
		maxAttempts int
		fallbacks   []string
	}{
		{"LastAttempt", 1, nil},
		{"WithAFallback", 3, []string{"backup"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			job, _, err := b.Store.Create(ctx, jobs.CreateParams{Tenant: "default", Credential: "main",
				Request: helloRequest, MaxAttempts: c.maxAttempts, Timeout: 2 * time.Second, Fallbacks: c.fallbacks})
			require.NoError(t, err)
			// The call's context ends at the job's deadline (2 s), not at the attempt's timeout.
			require.NoError(t, ex.Process(ctx, dispatch.Delivery{JobID: job.ID}))
			got, err := b.Store.Get(ctx, job.ID)
			require.NoError(t, err)
			require.Equal(t, jobs.StatusFailed, got.Status)
			require.Equal(t, jobs.ReasonDeadlineExceeded, got.LastError.Class)
			require.Equal(t, 1, got.Attempts)
		})
	}
}
