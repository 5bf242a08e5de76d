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
		lctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
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

// TestExecutor_SpendCapFailsOverWhenPostgresRefusesThePause: a spend cap on a job with a
// fallback pauses the credential and fails the job over at once. When Postgres refuses the
// pause's row (down a moment, say) while Redis takes the pause, the credential is paused all the
// same (sends stop; the failure is logged) and the job still fails over with its attempt
// recorded: the delivery is not handed back with the paid-for answer unrecorded, to come back
// on the paused credential and wait there for an operator.
func TestExecutor_SpendCapFailsOverWhenPostgresRefusesThePause(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := jobstest.New(t)
	lim, err := limiter.New(redistest.Client(t), &limiter.Config{Prefix: redistest.Prefix(t)})
	require.NoError(t, err)
	gate := lim.Gate("sk-capped", "capped")
	capped := executor.Upstream{Name: "capped", Kind: string(llm.KindAnthropic), Gate: gate,
		Provider: simProvider(t, llmsim.Config{Faults: llmsim.Faults{SpendCap: true}}, "sk-capped")}
	backup := executor.Upstream{Name: "backup", Kind: string(llm.KindAnthropic),
		Provider: simProvider(t, llmsim.Config{}, "sk-backup")}
	ex := executor.New(executor.Config{Store: b.Store, Pauses: credpause.NewStore(b.Pool, nil),
		Upstreams: map[string]executor.Upstream{"capped": capped, "backup": backup},
		Policy:    retrypolicy.New(&retrypolicy.Config{BaseDelay: time.Millisecond, MaxDelay: time.Millisecond})})
	// Redis knows the credential is not paused (no restore needed), and Postgres refuses the
	// pause's row.
	_, err = gate.Resume(ctx)
	require.NoError(t, err)
	_, err = b.Pool.Exec(ctx, `ALTER TABLE credential_pauses RENAME TO credential_pauses_unreachable`)
	require.NoError(t, err)

	job, _, err := b.Store.Create(ctx, jobs.CreateParams{Tenant: "default", Credential: "capped", Fallbacks: []string{"backup"},
		Request: helloRequest, MaxAttempts: 3, Timeout: time.Minute})
	require.NoError(t, err)
	perr := ex.Process(ctx, dispatch.Delivery{JobID: job.ID})
	var deferred *dispatch.DeferError
	require.ErrorAs(t, perr, &deferred, "the spend cap's failover was handed back to asynq as an error")
	require.Contains(t, deferred.Reason, "fail over")
	got, err := b.Store.Get(ctx, job.ID)
	require.NoError(t, err)
	require.Equal(t, jobs.StatusRetrying, got.Status)
	require.Equal(t, 1, got.CredentialIndex, "the job moves to its fallback")
	ps, err := gate.Paused(ctx)
	require.NoError(t, err)
	require.True(t, ps.Paused, "the credential is paused in Redis")

	// The fallback answers the next delivery.
	require.NoError(t, ex.Process(ctx, dispatch.Delivery{JobID: job.ID}))
	got, err = b.Store.Get(ctx, job.ID)
	require.NoError(t, err)
	require.Equal(t, jobs.StatusSucceeded, got.Status)
	require.Equal(t, "backup", *got.AnsweredBy)
}
