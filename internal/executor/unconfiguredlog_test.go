package executor_test

import (
	"context"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/dispatch"
	"github.com/llmq/llmq/internal/executor"
	"github.com/llmq/llmq/internal/jobs"
	"github.com/llmq/llmq/internal/jobstest"
	"github.com/llmq/llmq/internal/logtest"
)

// TestExecutor_UnconfiguredDeadLettersLogOncePerInterval: a credential removed from the config by
// mistake dead-letters every job on it (credential_not_configured). Each logged an ERROR line of
// its own: thousands of identical lines, for a mistake that its alert already reports once per
// credential. Their lines are one per credential per interval: the next line, once the interval
// has passed, says how many were held back, and so does a report of its own when no job follows;
// another credential's line is not held back by the first one's.
func TestExecutor_UnconfiguredDeadLettersLogOncePerInterval(t *testing.T) {
	t.Parallel()
	const n = 5
	const line = `msg="job dead-lettered"`
	type bundle struct {
		ex   *executor.Executor
		logs *logtest.Buffer
		now  *atomic.Pointer[time.Time]
		gone []string // the ids of n+1 jobs on "gone"
		lost string   // the id of a job on "lost"
	}
	setup := func(t *testing.T) (context.Context, *bundle) {
		ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
		t.Cleanup(cancel)
		b := jobstest.New(t)
		bb := &bundle{logs: &logtest.Buffer{}, now: &atomic.Pointer[time.Time]{}}
		create := func(cred string) string {
			job, _, err := b.Store.Create(ctx, jobs.CreateParams{Tenant: "default", Credential: cred,
				Request: helloRequest, MaxAttempts: 3, Timeout: time.Hour})
			require.NoError(t, err)
			return job.ID
		}
		for range n + 1 {
			bb.gone = append(bb.gone, create("gone"))
		}
		bb.lost = create("lost")
		// A worker started after the jobs were created, whose config has neither credential
		// (their jobs are not a newer config's: see executor.RolloutGrace).
		start := time.Now().Add(time.Second)
		bb.now.Store(&start)
		bb.ex = executor.New(executor.Config{Store: b.Store, Now: func() time.Time { return *bb.now.Load() },
			Logger: slog.New(slog.NewTextHandler(bb.logs, nil))})
		t.Cleanup(bb.ex.Stop)
		return ctx, bb
	}
	dead := func(t *testing.T, ctx context.Context, bb *bundle, id string) {
		t.Helper()
		require.NoError(t, bb.ex.Process(ctx, dispatch.Delivery{JobID: id}))
	}
	advance := func(bb *bundle, d time.Duration) {
		later := bb.now.Load().Add(d)
		bb.now.Store(&later)
	}

	t.Run("NextLineCountsThoseHeldBack", func(t *testing.T) {
		t.Parallel()
		ctx, bb := setup(t)
		// Given n jobs of a removed credential dead-lettered within the interval,
		for _, id := range bb.gone[:n] {
			dead(t, ctx, bb, id)
		}
		// one line is logged for them,
		require.Equal(t, 1, bb.logs.Count(line), "lines for %d dead letters of one credential:\n%s",
			n, bb.logs.String())
		// and another credential's dead letter is logged at once.
		dead(t, ctx, bb, bb.lost)
		require.Equal(t, 1, bb.logs.Count(`credential=lost`), bb.logs.String())
		// Once the interval has passed, the next line says how many were held back.
		advance(bb, executor.DefaultUnconfiguredLogInterval)
		dead(t, ctx, bb, bb.gone[n])
		require.Equal(t, 3, bb.logs.Count(line), bb.logs.String())
		require.Equal(t, 1, bb.logs.Count("suppressed=4"), bb.logs.String())
	})

	t.Run("ReportWhenNoneFollows", func(t *testing.T) {
		t.Parallel()
		ctx, bb := setup(t)
		var report atomic.Pointer[func()]
		executor.SetUnconfiguredLogAfterFunc(bb.ex, func(_ time.Duration, f func()) func() bool {
			report.Store(&f)
			return func() bool { return true }
		})
		// Given n jobs of a removed credential dead-lettered within the interval, and none after,
		for _, id := range bb.gone[:n] {
			dead(t, ctx, bb, id)
		}
		require.Equal(t, 1, bb.logs.Count(line), bb.logs.String())
		// once the interval has passed, a report says how many were held back, naming the last.
		require.NotNil(t, report.Load(), "no report scheduled for the lines held back")
		advance(bb, executor.DefaultUnconfiguredLogInterval)
		(*report.Load())()
		require.Equal(t, 2, bb.logs.Count(line), bb.logs.String())
		require.Equal(t, 1, bb.logs.Count("suppressed=4"), bb.logs.String())
		require.Equal(t, 1, bb.logs.Count("job_id="+bb.gone[n-1]), bb.logs.String())
		require.Equal(t, 2, bb.logs.Count("level=ERROR"), bb.logs.String())
	})
}
