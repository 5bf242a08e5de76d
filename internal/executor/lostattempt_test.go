package executor_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/breaker"
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

// TestExecutor_LostAttemptWaitsRetrying: a job whose attempt's delivery died (its worker was
// killed mid-call: running, its lease run out), delivered again while its credential cannot
// take it, is deferred without a call and shows it waits: retrying, its lease given back, its
// last_error saying the attempt was lost and why it waits. It stayed running, a call in flight
// that was not, until the credential came back. Once it does, the next attempt is the second,
// off the retry budget.
func TestExecutor_LostAttemptWaitsRetrying(t *testing.T) {
	t.Parallel()

	// lost returns a job of credential whose first attempt's delivery died.
	lost := func(t *testing.T, b *jobstest.Bundle, credential string) *jobs.Job {
		t.Helper()
		job, _, err := b.Store.Create(t.Context(), jobs.CreateParams{Tenant: "default", Credential: credential,
			Request: helloRequest, MaxAttempts: 10, Timeout: time.Hour})
		require.NoError(t, err)
		_, err = b.Store.BeginAttempt(t.Context(), job.ID)
		require.NoError(t, err)
		b.ExpireLease(t, job.ID)
		return job
	}
	requireLostAndWaiting := func(t *testing.T, b *jobstest.Bundle, id string, err error, why string) {
		t.Helper()
		var deferred *dispatch.DeferError
		require.ErrorAs(t, err, &deferred)
		require.Contains(t, deferred.Reason, why)
		got, gerr := b.Store.Get(t.Context(), id)
		require.NoError(t, gerr)
		require.Equal(t, jobs.StatusRetrying, got.Status, "a lost attempt's job shows a call in flight while it waits")
		require.Equal(t, 1, got.Attempts)
		require.Nil(t, got.LeaseUntil)
		require.NotNil(t, got.NextAttemptAt)
		require.Equal(t, string(retrypolicy.ClassCanceled), got.LastError.Class)
		require.Contains(t, got.LastError.Message, why)
		require.Equal(t, []jobs.Status{jobs.StatusQueued, jobs.StatusRunning, jobs.StatusRetrying}, b.Events(t, id))
	}

	t.Run("CredentialPaused", func(t *testing.T) {
		t.Parallel()
		ctx := t.Context()
		b := jobstest.New(t)
		lim, err := limiter.New(redistest.Client(t), &limiter.Config{Prefix: redistest.Prefix(t)})
		require.NoError(t, err)
		gate := lim.Gate("sk-backup", "backup")
		p := simProvider(t, llmsim.Config{}, "sk-backup")
		upstreams := map[string]executor.Upstream{
			"backup": {Name: "backup", Kind: string(llm.KindAnthropic), Provider: p, Gate: gate}}
		ex := executor.New(executor.Config{Store: b.Store, Upstreams: upstreams})
		job := lost(t, b, "backup")
		_, err = gate.Pause(ctx, "spend_cap", "")
		require.NoError(t, err)

		err = ex.Process(ctx, dispatch.Delivery{JobID: job.ID})
		requireLostAndWaiting(t, b, job.ID, err, "credential paused")

		// Resumed, the credential takes the job's second attempt, once the recheck's time has
		// come (a clock a minute on), its retry budget spent: the lost call was no failure of
		// the provider's, and its re-attempt is no retry the budget holds back.
		_, err = gate.Resume(ctx)
		require.NoError(t, err)
		spendRetryBudget(t, gate)
		later := executor.New(executor.Config{Store: b.Store, Upstreams: upstreams,
			Now: func() time.Time { return time.Now().Add(time.Minute) }})
		require.NoError(t, later.Process(ctx, dispatch.Delivery{JobID: job.ID}))
		got, err := b.Store.Get(ctx, job.ID)
		require.NoError(t, err)
		require.Equal(t, jobs.StatusSucceeded, got.Status)
		require.Equal(t, 2, got.Attempts)
	})

	t.Run("BreakerOpen", func(t *testing.T) {
		t.Parallel()
		ctx := t.Context()
		b := jobstest.New(t)
		brk, err := breaker.New(redistest.Client(t), &breaker.Config{Prefix: redistest.Prefix(t), Cooldown: time.Hour})
		require.NoError(t, err)
		circuit := brk.Circuit("sk-down", "down")
		// A warm breaker (it heard a success) opened by failures, its cooldown longer than the
		// test.
		report := func(o breaker.Outcome) {
			a, err := circuit.Allow(ctx)
			require.NoError(t, err)
			require.True(t, a.Allowed)
			_, err = circuit.Report(ctx, a, o)
			require.NoError(t, err)
		}
		report(breaker.Success)
		for {
			st, err := circuit.Status(ctx)
			require.NoError(t, err)
			if st.State == breaker.Open {
				break
			}
			report(breaker.Failure)
		}
		ex := executor.New(executor.Config{Store: b.Store, Upstreams: map[string]executor.Upstream{
			"down": {Name: "down", Kind: string(llm.KindAnthropic), Provider: simProvider(t, llmsim.Config{}, "sk-down"),
				Circuit: circuit}}})
		job := lost(t, b, "down")

		err = ex.Process(ctx, dispatch.Delivery{JobID: job.ID})
		requireLostAndWaiting(t, b, job.ID, err, "circuit open")
	})

	t.Run("CredentialNotInThisConfigYet", func(t *testing.T) {
		t.Parallel()
		ctx := t.Context()
		b := jobstest.New(t)
		// A process whose config lacks the job's credential, started before the job was created:
		// a process of a newer config took it, and this one leaves it to such a process.
		ex := executor.New(executor.Config{Store: b.Store})
		job := lost(t, b, "added")

		err := ex.Process(ctx, dispatch.Delivery{JobID: job.ID})
		requireLostAndWaiting(t, b, job.ID, err, "not in this process's config")
	})

	t.Run("TurnOnAColdCredentialKeepsRunning", func(t *testing.T) {
		t.Parallel()
		ctx := t.Context()
		b := jobstest.New(t)
		brk, err := breaker.New(redistest.Client(t), &breaker.Config{Prefix: redistest.Prefix(t), Threshold: 1})
		require.NoError(t, err)
		circuit := brk.Circuit("sk-cold", "cold")
		// A cold breaker (it heard no success yet) whose one call in flight is another job's.
		a, err := circuit.Allow(ctx)
		require.NoError(t, err)
		require.True(t, a.Allowed)
		ex := executor.New(executor.Config{Store: b.Store, Upstreams: map[string]executor.Upstream{
			"cold": {Name: "cold", Kind: string(llm.KindAnthropic), Provider: simProvider(t, llmsim.Config{}, "sk-cold"),
				Circuit: circuit}}})
		job := lost(t, b, "cold")

		// A wait for its turn on a credential that takes requests is short: the job stays
		// running, its next attempt a re-attempt of a lost call.
		var deferred *dispatch.DeferError
		require.ErrorAs(t, ex.Process(ctx, dispatch.Delivery{JobID: job.ID}), &deferred)
		require.Contains(t, deferred.Reason, "cold start")
		got, err := b.Store.Get(ctx, job.ID)
		require.NoError(t, err)
		require.Equal(t, jobs.StatusRunning, got.Status)
		require.NotNil(t, got.NextAttemptAt)
		require.Equal(t, []jobs.Status{jobs.StatusQueued, jobs.StatusRunning}, b.Events(t, job.ID))
	})
}
