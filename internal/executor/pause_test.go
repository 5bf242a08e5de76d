package executor_test

import (
	"context"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/credpause"
	"github.com/llmq/llmq/internal/dispatch"
	"github.com/llmq/llmq/internal/executor"
	"github.com/llmq/llmq/internal/jobs"
	"github.com/llmq/llmq/internal/jobstest"
	"github.com/llmq/llmq/internal/limiter"
	"github.com/llmq/llmq/internal/llm"
	"github.com/llmq/llmq/internal/llmsim"
	"github.com/llmq/llmq/internal/redistest"
	"github.com/llmq/llmq/internal/retrypolicy"
)

// TestExecutor_PauseKeptInPostgresOutlivesRedis: with Config.Pauses, a spend cap's pause is kept
// in Postgres, and after Redis lost its data neither a first attempt (checked in the reservation)
// nor a retry that draws on the retry budget (checked before it) is sent: each restores the pause
// and is deferred as paused. A successful pause probe ends the pause in Postgres too.
func TestExecutor_PauseKeptInPostgresOutlivesRedis(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := jobstest.New(t)
	prefix := redistest.Prefix(t)
	lim, err := limiter.New(redistest.Client(t), &limiter.Config{Prefix: prefix})
	require.NoError(t, err)
	sim := llmsim.New(llmsim.Config{Faults: llmsim.Faults{FailNext: 1}}) // the first call: a 500
	srv := httptest.NewServer(sim)
	t.Cleanup(srv.Close)
	p, err := llm.New(llm.Config{Kind: llm.KindAnthropic, BaseURL: srv.URL, APIKey: "sk-capped"})
	require.NoError(t, err)
	gate := lim.Gate("sk-capped", "capped")
	pauses := credpause.NewStore(b.Pool, nil)
	up := executor.Upstream{Name: "capped", Kind: string(llm.KindAnthropic), Provider: p, Gate: gate}
	ex := executor.New(executor.Config{Store: b.Store, Pauses: pauses, Upstreams: map[string]executor.Upstream{"capped": up},
		Policy: retrypolicy.New(&retrypolicy.Config{BaseDelay: time.Millisecond, MaxDelay: time.Millisecond})})
	lose := func() {
		lctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		redistest.Unlink(lctx, redistest.Client(t), prefix+"*")
	}
	requirePausedDeferral := func(t *testing.T, err error) {
		t.Helper()
		var deferred *dispatch.DeferError
		require.ErrorAs(t, err, &deferred)
		require.Contains(t, deferred.Reason, "credential paused")
	}

	// Given a job that failed once (a 500: its retry draws on the retry budget),
	retried, err := process(t, b, ex, "capped", 5, time.Hour)
	require.Error(t, err)
	require.Equal(t, jobs.StatusRetrying, retried.Status)
	// and the credential paused by a spend cap,
	require.NoError(t, sim.SetFaults(llmsim.Faults{SpendCap: true}))
	dead, err := process(t, b, ex, "capped", 5, time.Hour)
	require.NoError(t, err)
	require.Equal(t, jobs.StatusDead, dead.Status)
	require.Equal(t, 2, sim.Stats().Requests)
	kept, err := pauses.Get(ctx, gate)
	require.NoError(t, err)
	require.True(t, kept.Paused)
	require.Equal(t, dead.ID, kept.FirstJobID)

	// when Redis loses its data, then a first attempt is deferred as paused without a call,
	lose()
	first, err := process(t, b, ex, "capped", 5, time.Hour)
	requirePausedDeferral(t, err)
	require.Equal(t, jobs.StatusQueued, first.Status)
	// and so is the retry, after Redis lost it again.
	lose()
	require.Equal(t, jobs.StatusRetrying, retried.Status)
	requirePausedDeferral(t, ex.Process(ctx, dispatch.Delivery{JobID: retried.ID}))
	require.Equal(t, 2, sim.Stats().Requests, "a paused credential sent a request after Redis lost its data")

	// When the cap is lifted, a successful probe resumes the credential in Postgres too.
	require.NoError(t, sim.SetFaults(llmsim.Faults{}))
	probing := up
	probing.PauseProbeInterval = time.Nanosecond
	prober := executor.New(executor.Config{Store: b.Store, Pauses: pauses, Upstreams: map[string]executor.Upstream{"capped": probing}})
	probed, err := process(t, b, prober, "capped", 5, time.Hour)
	require.NoError(t, err)
	require.Equal(t, jobs.StatusSucceeded, probed.Status)
	require.Equal(t, 3, sim.Stats().Requests)
	kept, err = pauses.Get(ctx, gate)
	require.NoError(t, err)
	require.False(t, kept.Paused, "the probe's resume left the pause in Postgres")
}
