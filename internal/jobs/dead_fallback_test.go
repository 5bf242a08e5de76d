package jobs_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/jobs"
	"github.com/llmq/llmq/internal/jobstest"
)

// deadOnFallback commits a job of credential "default" with fallbacks "backup" and "spare" that
// failed over from default to backup and died there: its alert and llmq_dead_letters_total
// name backup.
func deadOnFallback(t *testing.T, b *jobstest.Bundle) *jobs.Job {
	t.Helper()
	job, _, err := b.Store.Create(t.Context(), jobs.CreateParams{Tenant: "default", Credential: "default",
		Fallbacks: []string{"backup", "spare"}, Fingerprint: "fp", Request: json.RawMessage(`{"model":"m"}`),
		MaxAttempts: 3, Timeout: time.Minute})
	require.NoError(t, err)
	b.Attempt(t, job.ID, jobs.Outcome{Status: jobs.StatusRetrying, NextCredential: true})
	b.Attempt(t, job.ID, jobs.Outcome{Status: jobs.StatusDead, DeadReason: jobs.ReasonRateLimitedNoRetryAfter})
	j, err := b.Store.Get(t.Context(), job.ID)
	require.NoError(t, err)
	require.Equal(t, "backup", j.CurrentCredential(), "died on its first fallback")
	return j
}

// TestStore_RetryDeadStartsOverAtThePrimaryCredential: a dead job retried gets its whole
// credential chain back, as it gets its attempts: it starts at its own credential again. Kept on
// the fallback it died on, it never went back to its own credential (resumed, serving) and, its
// fallback still paused, waited there with no fallback left until its deadline failed it.
func TestStore_RetryDeadStartsOverAtThePrimaryCredential(t *testing.T) {
	t.Parallel()
	b := jobstest.New(t)
	job := deadOnFallback(t, b)

	got, err := b.Store.RetryDead(t.Context(), jobs.DeadFilter{IDs: []string{job.ID}}, nil)
	require.NoError(t, err)
	require.Equal(t, []string{job.ID}, unfinishedIDs(got))
	j, err := b.Store.Get(t.Context(), job.ID)
	require.NoError(t, err)
	require.Equal(t, "default", j.CurrentCredential(), "the retry starts at the job's own credential")
	require.True(t, j.HasNextCredential(), "with its fallbacks ahead of it")
}

// TestStore_DeadFilterCredentialSelectsTheCredentialsTheJobUsed: the credential filter (ctl dead
// list/retry --credential, the console's) selects a dead job by every credential it was sent
// to: its own, and the fallbacks it failed over to, the last of which it died on (the
// credential its alert names, "ctl dead list --credential X"). A fallback it never reached
// does not select it.
func TestStore_DeadFilterCredentialSelectsTheCredentialsTheJobUsed(t *testing.T) {
	t.Parallel()
	b := jobstest.New(t)
	job := deadOnFallback(t, b)
	other := b.Dead(t, jobstest.Opts{Credential: "backup"}, jobs.ReasonRetriesExhausted, 1)

	for cred, want := range map[string][]string{
		"backup":  {other.ID, job.ID},
		"default": {job.ID},
		"spare":   {},
	} {
		list, err := b.Store.PageDead(t.Context(), jobs.DeadFilter{Credential: cred}, "")
		require.NoError(t, err)
		require.Equal(t, want, ids(list.Jobs), "ctl dead list --credential %s", cred)
	}
	got, err := b.Store.RetryDead(t.Context(), jobs.DeadFilter{Credential: "backup", Reason: jobs.ReasonRateLimitedNoRetryAfter}, nil)
	require.NoError(t, err)
	require.Equal(t, []string{job.ID}, unfinishedIDs(got), "ctl dead retry --all --credential backup")
}

// TestStore_PageCredentialSelectsTheCredentialsTheJobUsed: the job list's credential filter (the
// console's ?credential=) selects a job by every credential it was sent to, as the dead letters'
// does (TestStore_DeadFilterCredentialSelectsTheCredentialsTheJobUsed): its own, and the
// fallbacks it failed over to, the one that answered it or that it waits on now. It selected the
// job's own credential only: a job a fallback answered was not found under that fallback, while
// a job that died on it was. A fallback a job never reached does not select it.
func TestStore_PageCredentialSelectsTheCredentialsTheJobUsed(t *testing.T) {
	t.Parallel()
	b := jobstest.New(t)
	create := func() *jobs.Job {
		job, _, err := b.Store.Create(t.Context(), jobs.CreateParams{Tenant: "default", Credential: "default",
			Fallbacks: []string{"backup", "spare"}, Fingerprint: "fp", Request: json.RawMessage(`{"model":"m"}`),
			MaxAttempts: 3, Timeout: time.Minute})
		require.NoError(t, err)
		return job
	}
	answered := create() // failed over to backup, which answered it
	b.Attempt(t, answered.ID, jobs.Outcome{Status: jobs.StatusRetrying, NextCredential: true})
	b.Attempt(t, answered.ID, jobs.Outcome{Status: jobs.StatusSucceeded, Result: json.RawMessage(`{"ok":true}`),
		AnsweredBy: "backup"})
	retrying := create() // failed over to backup, waiting to try it
	b.Attempt(t, retrying.ID, jobs.Outcome{Status: jobs.StatusRetrying, NextCredential: true})
	own := b.Create(t, jobstest.Opts{Credential: "backup"})
	queued := create() // never sent anywhere but its own credential, if at all

	for cred, want := range map[string][]string{
		"backup":  {own.ID, retrying.ID, answered.ID},
		"default": {queued.ID, retrying.ID, answered.ID},
		"spare":   {},
	} {
		page, err := b.Store.Page(t.Context(), jobs.PageParams{Credential: cred})
		require.NoError(t, err)
		require.Equal(t, want, ids(page.Jobs), "the console's jobs ?credential=%s", cred)
	}
}
