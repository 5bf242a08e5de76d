package executor_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/alert"
	"github.com/llmq/llmq/internal/dispatch"
	"github.com/llmq/llmq/internal/executor"
	"github.com/llmq/llmq/internal/jobs"
	"github.com/llmq/llmq/internal/jobstest"
	"github.com/llmq/llmq/internal/llm"
	"github.com/llmq/llmq/internal/llmsim"
)

// TestExecutor_RemovedCredentialFailsOver: a job whose credential was removed from the config
// (an operator retried its dead letter, which starts over at its own credential, after removing
// it; or it waited on it through the restart) goes to its fallbacks, as a job on a paused
// credential does, instead of being failed while a configured fallback is left. A fallback that
// was removed too is passed over; with none left the job fails, naming the credential.
func TestExecutor_RemovedCredentialFailsOver(t *testing.T) {
	t.Parallel()

	t.Run("ToAConfiguredFallback", func(t *testing.T) {
		t.Parallel()
		ctx := t.Context()
		b := jobstest.New(t)
		// Given a job on "gone", with fallbacks "also-gone" and "backup", waiting in the queue
		job, _, err := b.Store.Create(ctx, jobs.CreateParams{Tenant: "default", Credential: "gone",
			Fallbacks: []string{"also-gone", "backup"}, Request: helloRequest, MaxAttempts: 3, Timeout: time.Hour})
		require.NoError(t, err)
		// when a worker whose config has only "backup" delivers it,
		backup := executor.Upstream{Name: "backup", Kind: string(llm.KindAnthropic),
			Provider: simProvider(t, llmsim.Config{}, "sk-backup")}
		ex := executor.New(executor.Config{Store: b.Store, Upstreams: map[string]executor.Upstream{"backup": backup}})
		require.NoError(t, ex.Process(ctx, dispatch.Delivery{JobID: job.ID}))
		// then the fallback answers it.
		got, err := b.Store.Get(ctx, job.ID)
		require.NoError(t, err)
		require.Equal(t, jobs.StatusSucceeded, got.Status, "last error: %+v", got.LastError)
		require.Equal(t, "backup", *got.AnsweredBy)
		require.Equal(t, 2, got.CredentialIndex)
	})

	t.Run("NoneLeft", func(t *testing.T) {
		t.Parallel()
		ctx := t.Context()
		b := jobstest.New(t)
		job, _, err := b.Store.Create(ctx, jobs.CreateParams{Tenant: "default", Credential: "gone",
			Fallbacks: []string{"also-gone"}, Request: helloRequest, MaxAttempts: 3, Timeout: time.Hour})
		require.NoError(t, err)
		backup := executor.Upstream{Name: "backup", Kind: string(llm.KindAnthropic),
			Provider: simProvider(t, llmsim.Config{}, "sk-backup")}
		ex := executor.New(executor.Config{Store: b.Store, Upstreams: map[string]executor.Upstream{"backup": backup}})
		require.NoError(t, ex.Process(ctx, dispatch.Delivery{JobID: job.ID}))
		got, err := b.Store.Get(ctx, job.ID)
		require.NoError(t, err)
		require.Equal(t, jobs.StatusDead, got.Status)
		require.Equal(t, jobs.ReasonCredentialNotConfigured, *got.DeadReason)
		require.Equal(t, `credential "also-gone" is no longer configured`, got.LastError.Message)
	})
}

// TestExecutor_CredentialOnlyANewerConfigKnowsWaits: in a rolling deploy that adds a credential,
// a process of the new config accepts a job on it (or runs its first attempt and defers it) and
// a worker of the old config, started before the job was created, delivers it. That worker's
// config is the stale one: it defers the job for a process that knows the credential, instead
// of dead-lettering it as "no longer configured". A job that no process served within the
// rollout's grace is dead-lettered (credential_not_configured) as on a removed credential.
func TestExecutor_CredentialOnlyANewerConfigKnowsWaits(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := jobstest.New(t)
	backup := executor.Upstream{Name: "backup", Kind: string(llm.KindAnthropic),
		Provider: simProvider(t, llmsim.Config{}, "sk-backup")}
	// Given a worker of the old config, started before the job was created,
	started := time.Now()
	var now atomic.Pointer[time.Time] // nil: the real clock
	clock := func() time.Time {
		if t := now.Load(); t != nil {
			return *t
		}
		return time.Now()
	}
	old := executor.New(executor.Config{Store: b.Store, Now: clock, Upstreams: map[string]executor.Upstream{"backup": backup}})
	// and a job on the credential the new config added, created after it started,
	job, _, err := b.Store.Create(ctx, jobs.CreateParams{Tenant: "default", Credential: "added",
		Request: helloRequest, MaxAttempts: 3, Timeout: time.Hour})
	require.NoError(t, err)
	require.True(t, job.CreatedAt.After(started.Add(-time.Second)))

	// when the old worker delivers it, the job is deferred, not failed.
	perr := old.Process(ctx, dispatch.Delivery{JobID: job.ID})
	var deferred *dispatch.DeferError
	require.ErrorAs(t, perr, &deferred, "the old worker failed the job instead of leaving it to a newer one")
	require.Contains(t, deferred.Reason, `credential "added"`)
	got, err := b.Store.Get(ctx, job.ID)
	require.NoError(t, err)
	require.Equal(t, jobs.StatusQueued, got.Status)

	// Past the rollout's grace, nothing will: the job is a dead letter, naming the credential.
	late := job.CreatedAt.Add(executor.RolloutGrace + time.Second)
	now.Store(&late)
	require.NoError(t, old.Process(ctx, dispatch.Delivery{JobID: job.ID}))
	got, err = b.Store.Get(ctx, job.ID)
	require.NoError(t, err)
	require.Equal(t, jobs.StatusDead, got.Status)
	require.Equal(t, jobs.ReasonCredentialNotConfigured, *got.DeadReason)
	require.Contains(t, got.LastError.Message, `credential "added"`)
}

// TestExecutor_UnconfiguredCredentialsJobsComeBack: an operator removes (or renames) a
// credential from the workers' config by mistake: its queued jobs are dead-lettered
// (credential_not_configured), with one alert for them all and no pause; once the credential is
// back, a retry of that reason's dead letters runs them. They were failed, for good.
func TestExecutor_UnconfiguredCredentialsJobsComeBack(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	hookURL, posted := alertWebhook(t, 8)
	b := jobstest.New(t)
	backup := executor.Upstream{Name: "backup", Kind: string(llm.KindAnthropic),
		Provider: simProvider(t, llmsim.Config{}, "sk-backup")}
	// Given jobs on "main", queued when the worker started with a config that lacks it,
	var ids []string
	for range 3 {
		job, _, err := b.Store.Create(ctx, jobs.CreateParams{Tenant: "default", Credential: "main",
			Request: helloRequest, MaxAttempts: 3, Timeout: time.Hour})
		require.NoError(t, err)
		ids = append(ids, job.ID)
	}
	alerter := alert.New(alert.Config{WebhookURL: hookURL})
	mistaken := executor.New(executor.Config{Store: b.Store, Alerter: alerter,
		Upstreams: map[string]executor.Upstream{"backup": backup}})

	// when that worker delivers them, each is a dead letter naming the credential,
	for _, id := range ids {
		require.NoError(t, mistaken.Process(ctx, dispatch.Delivery{JobID: id}))
		got, err := b.Store.Get(ctx, id)
		require.NoError(t, err)
		require.Equal(t, jobs.StatusDead, got.Status, "last error: %+v", got.LastError)
		require.Equal(t, jobs.ReasonCredentialNotConfigured, *got.DeadReason)
		require.Contains(t, got.LastError.Message, `credential "main"`)
	}
	// and one alert tells the operator of them all.
	require.NoError(t, alerter.Wait(ctx))
	require.Len(t, posted, 1, "one alert for the credential, not one per job")
	body := <-posted
	require.Contains(t, body, `"credential":"main"`)
	require.Contains(t, body, `"reason":"`+jobs.ReasonCredentialNotConfigured+`"`)

	// Once the credential is back, a retry of that reason's dead letters runs them.
	retried, err := b.Store.RetryDead(ctx, jobs.DeadFilter{Reason: jobs.ReasonCredentialNotConfigured}, nil)
	require.NoError(t, err)
	require.Len(t, retried, len(ids))
	main := executor.Upstream{Name: "main", Kind: string(llm.KindAnthropic),
		Provider: simProvider(t, llmsim.Config{}, "sk-main")}
	restored := executor.New(executor.Config{Store: b.Store, Alerter: alerter,
		Upstreams: map[string]executor.Upstream{"main": main, "backup": backup}})
	for _, id := range ids {
		require.NoError(t, restored.Process(ctx, dispatch.Delivery{JobID: id}))
		got, err := b.Store.Get(ctx, id)
		require.NoError(t, err)
		require.Equal(t, jobs.StatusSucceeded, got.Status, "last error: %+v", got.LastError)
		require.Equal(t, "main", *got.AnsweredBy)
	}
}
