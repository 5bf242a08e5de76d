package jobs_test

import (
	"context"
	"encoding/json"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/jobs"
	"github.com/llmq/llmq/internal/jobstest"
)

func ids(js []*jobs.Job) []string {
	out := make([]string, len(js))
	for i, j := range js {
		out[i] = j.ID
	}
	return out
}

func TestStore_List(t *testing.T) {
	t.Parallel()
	b := jobstest.New(t)
	ctx := context.Background()
	first := b.Create(t, jobstest.Opts{})
	second := b.Create(t, jobstest.Opts{})
	_, err := b.Store.Cancel(ctx, first.ID)
	require.NoError(t, err)

	all, err := b.Store.List(ctx, jobs.ListParams{})
	require.NoError(t, err)
	require.Equal(t, []string{second.ID, first.ID}, ids(all), "newest first")

	canceled, err := b.Store.List(ctx, jobs.ListParams{Status: jobs.StatusCanceled})
	require.NoError(t, err)
	require.Equal(t, []string{first.ID}, ids(canceled))

	one, err := b.Store.List(ctx, jobs.ListParams{Limit: 1})
	require.NoError(t, err)
	require.Len(t, one, 1)

	acme := b.Create(t, jobstest.Opts{Tenant: "acme"})
	of, err := b.Store.List(ctx, jobs.ListParams{Tenant: "acme"})
	require.NoError(t, err)
	require.Equal(t, []string{acme.ID}, ids(of), "the tenant's only")
	of, err = b.Store.List(ctx, jobs.ListParams{Tenant: "default", Status: jobs.StatusQueued})
	require.NoError(t, err)
	require.Equal(t, []string{second.ID}, ids(of))
	of, err = b.Store.List(ctx, jobs.ListParams{Tenant: "nobody"})
	require.NoError(t, err)
	require.Empty(t, of)
}

// TestStore_PageDeadFilters: each of DeadFilter's fields selects its dead jobs on a page.
func TestStore_PageDeadFilters(t *testing.T) {
	t.Parallel()
	b := jobstest.New(t)
	ctx := context.Background()
	exhausted := b.Dead(t, jobstest.Opts{}, jobs.ReasonRetriesExhausted, 3)
	capped := b.Dead(t, jobstest.Opts{Credential: "other", Tenant: "acme"}, jobs.ReasonRateLimitedNoRetryAfter, 1)
	b.Create(t, jobstest.Opts{}) // not dead

	cases := map[string]struct {
		f    jobs.DeadFilter
		want []string
	}{
		"All":        {jobs.DeadFilter{}, []string{capped.ID, exhausted.ID}},
		"Reason":     {jobs.DeadFilter{Reason: jobs.ReasonRetriesExhausted}, []string{exhausted.ID}},
		"Credential": {jobs.DeadFilter{Credential: "other"}, []string{capped.ID}},
		"Tenant":     {jobs.DeadFilter{Tenant: "acme"}, []string{capped.ID}},
		"Since":      {jobs.DeadFilter{Since: time.Now().Add(time.Hour)}, []string{}},
		"Limit":      {jobs.DeadFilter{Limit: 1}, []string{capped.ID}},
		"IDs":        {jobs.DeadFilter{IDs: []string{exhausted.ID, "junk"}}, []string{exhausted.ID}},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			got, err := b.Store.PageDead(ctx, tc.f, "")
			require.NoError(t, err)
			require.Equal(t, tc.want, ids(got.Jobs))
		})
	}
}

func TestStore_RetryDead(t *testing.T) {
	t.Parallel()

	t.Run("FreshAttemptsHistoryKept", func(t *testing.T) {
		t.Parallel()
		b := jobstest.New(t)
		ctx := context.Background()
		// A short timeout that has passed by the time the operator retries.
		job := b.Dead(t, jobstest.Opts{Timeout: time.Millisecond, Priority: jobs.PriorityLow}, jobs.ReasonRetriesExhausted, 3)

		got, err := b.Store.RetryDead(ctx, jobs.DeadFilter{IDs: []string{job.ID}}, nil)
		require.NoError(t, err)
		require.Equal(t, []jobs.Unfinished{{ID: job.ID, Status: jobs.StatusQueued, Priority: jobs.PriorityLow}}, got,
			"the job, with the priority that names its task's queue")

		j, err := b.Store.Get(ctx, job.ID)
		require.NoError(t, err)
		require.Equal(t, jobs.StatusQueued, j.Status)
		require.Equal(t, 0, j.Attempts)
		require.Nil(t, j.DeadReason)
		require.Nil(t, j.FinishedAt)
		require.True(t, j.Deadline.After(time.Now().Add(-time.Second)), "deadline renewed: %s", j.Deadline)
		require.NotNil(t, j.LastError, "the last error stays for the operator")
		require.Equal(t, []jobs.Status{"queued", "running", "retrying", "running", "retrying", "running", "dead", "queued"}, b.Events(t, job.ID))
		evs, err := b.Store.Events(ctx, job.ID, 7)
		require.NoError(t, err)
		require.JSONEq(t, `{"retried_from":"dead","previous_reason":"retries_exhausted"}`, string(evs[0].Payload))

		// The next round numbers its attempts after the old ones (the worker says 1 and 2).
		b.Attempt(t, job.ID, jobs.Outcome{Status: jobs.StatusRetrying})
		b.Attempt(t, job.ID, jobs.Outcome{Status: jobs.StatusSucceeded, Result: json.RawMessage(`{"ok":true}`)})
		attempts, err := b.Store.Attempts(ctx, job.ID)
		require.NoError(t, err)
		numbers := make([]int, len(attempts))
		for i, a := range attempts {
			numbers[i] = a.Number
		}
		require.Equal(t, []int{1, 2, 3, 4, 5}, numbers)
		j, err = b.Store.Get(ctx, job.ID)
		require.NoError(t, err)
		require.Equal(t, jobs.StatusSucceeded, j.Status)
		require.Equal(t, 2, j.Attempts)
	})

	t.Run("TwiceContinuesNumbering", func(t *testing.T) {
		t.Parallel()
		b := jobstest.New(t)
		ctx := context.Background()
		job := b.Dead(t, jobstest.Opts{}, jobs.ReasonRetriesExhausted, 2)
		for range 2 {
			_, err := b.Store.RetryDead(ctx, jobs.DeadFilter{IDs: []string{job.ID}}, nil)
			require.NoError(t, err)
			b.Attempt(t, job.ID, jobs.Outcome{Status: jobs.StatusDead, DeadReason: jobs.ReasonRetriesExhausted})
		}
		attempts, err := b.Store.Attempts(ctx, job.ID)
		require.NoError(t, err)
		require.Len(t, attempts, 4)
		require.Equal(t, 4, attempts[3].Number)
	})

	t.Run("OnlyDeadJobs", func(t *testing.T) {
		t.Parallel()
		b := jobstest.New(t)
		ctx := context.Background()
		live := b.Create(t, jobstest.Opts{})
		got, err := b.Store.RetryDead(ctx, jobs.DeadFilter{IDs: []string{live.ID, "junk", "0190a5b2-7c1e-7d3f-9a8b-123456789abc"}}, nil)
		require.NoError(t, err)
		require.Empty(t, got)
		require.Equal(t, []jobs.Status{"queued"}, b.Events(t, live.ID))
	})

	t.Run("ByReason", func(t *testing.T) {
		t.Parallel()
		b := jobstest.New(t)
		ctx := context.Background()
		exhausted := b.Dead(t, jobstest.Opts{}, jobs.ReasonRetriesExhausted, 1)
		capped := b.Dead(t, jobstest.Opts{}, jobs.ReasonRateLimitedNoRetryAfter, 1)

		got, err := b.Store.RetryDead(ctx, jobs.DeadFilter{Reason: jobs.ReasonRateLimitedNoRetryAfter}, nil)
		require.NoError(t, err)
		require.Equal(t, []string{capped.ID}, unfinishedIDs(got))
		left, err := b.Store.PageDead(ctx, jobs.DeadFilter{}, "")
		require.NoError(t, err)
		require.Equal(t, []string{exhausted.ID}, ids(left.Jobs))
	})
}

// TestStore_RetryDeadInBatches: a retry of many dead jobs commits them a batch at a time, oldest
// death first, so it never holds every match's row lock at once: while it waits for a job another
// transaction holds (a sweep, an operator's purge), the batches before are committed, queued for
// everyone and free to lock. It takes the locked job once it is free: none is missed.
func TestStore_RetryDeadInBatches(t *testing.T) {
	t.Parallel()
	b := jobstest.New(t)
	ctx := t.Context()
	// Given 600 dead jobs (more than a batch), dead one second apart, the last to die locked.
	rows, err := b.Pool.Query(ctx, `INSERT INTO jobs (id, credential, fingerprint, status, request, max_attempts,
	timeout_ms, deadline, dead_reason, created_at, finished_at)
SELECT gen_random_uuid(), 'default', 'f', 'dead', '{}', 3, 60000, now(), 'retries_exhausted',
	now() - g * interval '1 minute', now() - g * interval '1 second'
FROM generate_series(1, 600) g ORDER BY g RETURNING id::text`)
	require.NoError(t, err)
	dead, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	lastToDie, firstToDie := dead[0], dead[len(dead)-1]
	lock, err := b.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = lock.Rollback(context.WithoutCancel(ctx)) }()
	_, err = lock.Exec(ctx, `SELECT 1 FROM jobs WHERE id = $1 FOR UPDATE`, lastToDie)
	require.NoError(t, err)

	type result struct {
		got []jobs.Unfinished
		err error
	}
	done := make(chan result, 1)
	go func() {
		got, err := b.Store.RetryDead(ctx, jobs.DeadFilter{Reason: jobs.ReasonRetriesExhausted}, nil) // batches of 500
		done <- result{got, err}
	}()
	require.Eventually(t, func() bool { // on testify's goroutine: no require here
		var waiting bool
		err := b.Pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity
WHERE datname = current_database() AND wait_event_type = 'Lock')`).Scan(&waiting)
		return err == nil && waiting
	}, 30*time.Second, 10*time.Millisecond, "the retry waits for the locked job")

	// While it waits, the first batch is committed: queued, and nobody's lock holds it.
	tx, err := b.Pool.Begin(ctx)
	require.NoError(t, err)
	var status jobs.Status
	err = tx.QueryRow(ctx, `SELECT status FROM jobs WHERE id = $1 FOR UPDATE NOWAIT`, firstToDie).Scan(&status)
	require.NoError(t, tx.Rollback(ctx))
	require.NoError(t, err, "the first job to die is not locked any more")
	require.Equal(t, jobs.StatusQueued, status)

	// Once the lock is gone the retry ends, every job retried once.
	require.NoError(t, lock.Rollback(ctx))
	var r result
	select {
	case r = <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("RetryDead did not end after the lock was gone")
	}
	require.NoError(t, r.err)
	require.ElementsMatch(t, dead, unfinishedIDs(r.got))
}

// TestStore_RetryDeadConcurrently: retries that run at once (ctl's --all, a console selection)
// lock their jobs in one order, so none fails on a deadlock, and each job is retried once. Jobs
// whose deaths began in the same microsecond (a burst of deaths: a spend cap, an outage) share
// finished_at: ordered by it alone, each statement locked them in its own plan's order, and
// retries deadlocked.
func TestStore_RetryDeadConcurrently(t *testing.T) {
	t.Parallel()
	b := jobstest.New(t)
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	// Given 3,000 dead jobs, 60 at each finished_at.
	rows, err := b.Pool.Query(ctx, `INSERT INTO jobs (id, credential, fingerprint, status, request, max_attempts,
	timeout_ms, deadline, dead_reason, finished_at)
SELECT gen_random_uuid(), 'default', 'f', 'dead', '{}', 3, 60000, now(), 'retries_exhausted',
	date_trunc('second', now()) - (g % 50) * interval '1 second'
FROM generate_series(1, 3000) g RETURNING id::text`)
	require.NoError(t, err)
	dead, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)

	type result struct {
		got []jobs.Unfinished
		err error
	}
	const runs = 4
	done := make(chan result, runs)
	for i := range runs {
		f := jobs.DeadFilter{}
		if i%2 == 1 {
			f.IDs = dead
		}
		go func() {
			got, err := b.Store.RetryDead(ctx, f, &jobs.RetryDeadOpts{Batch: 37})
			done <- result{got, err}
		}()
	}
	retried := map[string]int{}
	for range runs {
		var r result
		select {
		case r = <-done:
		case <-ctx.Done():
			t.Fatal("the retries did not end")
		}
		require.NoError(t, r.err)
		for _, u := range r.got {
			retried[u.ID]++
		}
	}
	require.Len(t, retried, len(dead))
	for id, n := range retried {
		require.Equal(t, 1, n, "job %s retried once", id)
	}
}

// TestStore_RetryDeadOnceEach: a job a retry put back that dies again before the retry ends
// (a spend cap still on) is not retried a second time by it, and the retry ends; each batch is
// handed to BatchFunc once it committed.
func TestStore_RetryDeadOnceEach(t *testing.T) {
	t.Parallel()
	b := jobstest.New(t)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	var dead []string
	for range 5 {
		dead = append(dead, b.Dead(t, jobstest.Opts{}, jobs.ReasonRateLimitedNoRetryAfter, 1).ID)
	}

	var batches [][]string
	got, err := b.Store.RetryDead(ctx, jobs.DeadFilter{Reason: jobs.ReasonRateLimitedNoRetryAfter}, &jobs.RetryDeadOpts{
		Batch: 2,
		BatchFunc: func(ctx context.Context, retried []jobs.Unfinished) error {
			batches = append(batches, unfinishedIDs(retried))
			for _, u := range retried {
				require.Equal(t, jobs.StatusQueued, getStatus(t, b, u.ID), "committed before BatchFunc")
				b.Attempt(t, u.ID, jobs.Outcome{Status: jobs.StatusDead, DeadReason: jobs.ReasonRateLimitedNoRetryAfter})
			}
			return nil
		},
	})
	require.NoError(t, err)
	require.ElementsMatch(t, dead, unfinishedIDs(got))
	require.Len(t, got, 5, "each once")
	require.Equal(t, []int{2, 2, 1}, []int{len(batches[0]), len(batches[1]), len(batches[2])})
	require.Equal(t, dead[:2], sorted(batches[0], dead), "oldest death first")
}

// getStatus is job id's status.
func getStatus(t *testing.T, b *jobstest.Bundle, id string) jobs.Status {
	t.Helper()
	j, err := b.Store.Get(t.Context(), id)
	require.NoError(t, err)
	return j.Status
}

// sorted returns ids in the order they appear in order.
func sorted(ids, order []string) []string {
	var out []string
	for _, id := range order {
		if slices.Contains(ids, id) {
			out = append(out, id)
		}
	}
	return out
}

func TestStore_PurgeDead(t *testing.T) {
	t.Parallel()
	b := jobstest.New(t)
	ctx := context.Background()
	old := b.Dead(t, jobstest.Opts{}, jobs.ReasonRetriesExhausted, 1)
	recent := b.Dead(t, jobstest.Opts{}, jobs.ReasonRetriesExhausted, 1)
	live := b.Create(t, jobstest.Opts{})
	_, err := b.Pool.Exec(ctx, `UPDATE jobs SET finished_at = now() - interval '2 days' WHERE id = $1`, old.ID)
	require.NoError(t, err)

	n, err := b.Store.PurgeDead(ctx, time.Now().Add(-24*time.Hour), nil)
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
	_, err = b.Store.Get(ctx, old.ID)
	require.ErrorIs(t, err, jobs.ErrNotFound)
	var attempts, events int
	require.NoError(t, b.Pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM job_attempts WHERE job_id = $1), (SELECT count(*) FROM job_events WHERE job_id = $1)`, old.ID).Scan(&attempts, &events))
	require.Zero(t, attempts)
	require.Zero(t, events)
	for _, id := range []string{recent.ID, live.ID} {
		_, err := b.Store.Get(ctx, id)
		require.NoError(t, err)
	}
	// The kept jobs keep their history.
	require.NoError(t, b.Pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM job_attempts WHERE job_id = $1), (SELECT count(*) FROM job_events WHERE job_id = $1)`, recent.ID).Scan(&attempts, &events))
	require.Equal(t, 1, attempts)
	require.Positive(t, events)

	// A delivery that finishes after its job was purged records nothing: no orphan attempt.
	applied, err := b.Store.Finish(ctx, old.ID, &jobs.Attempt{Number: 2, Credential: "c", StartedAt: time.Now(), Class: "ok"},
		jobs.Outcome{Status: jobs.StatusSucceeded})
	require.NoError(t, err)
	require.False(t, applied)
	require.NoError(t, b.Pool.QueryRow(ctx, `SELECT count(*) FROM job_attempts WHERE job_id = $1`, old.ID).Scan(&attempts))
	require.Zero(t, attempts)
}

func TestStore_Stats(t *testing.T) {
	t.Parallel()
	b := jobstest.New(t)
	ctx := context.Background()

	t.Run("Empty", func(t *testing.T) {
		t.Parallel()
		e := jobstest.New(t)
		st, err := e.Store.Stats(ctx, time.Hour)
		require.NoError(t, err)
		require.Empty(t, st.ByStatus)
		require.Nil(t, st.RetryRate)
		require.Nil(t, st.RequestsPerSuccess)
		require.Nil(t, st.SubmitToResultP50MS)
	})

	// The window's successes are read once, for their count and percentiles, and that count is
	// the succeeded one by status (absent with none: the negative window below).
	t.Run("OneSuccess", func(t *testing.T) {
		t.Parallel()
		e := jobstest.New(t)
		ok := e.Create(t, jobstest.Opts{})
		e.Attempt(t, ok.ID, jobs.Outcome{Status: jobs.StatusSucceeded})
		_, err := e.Pool.Exec(ctx, `UPDATE jobs SET finished_at = deadline - timeout_ms * interval '1 millisecond'
	+ interval '1.5 seconds' WHERE id = $1`, ok.ID)
		require.NoError(t, err)
		st, err := e.Store.Stats(ctx, time.Hour)
		require.NoError(t, err)
		require.Equal(t, map[jobs.Status]int{"succeeded": 1}, st.ByStatus)
		require.Equal(t, 1, st.Succeeded)
		require.InDelta(t, 1.0, *st.RequestsPerSuccess, 1e-9)
		require.InDelta(t, 1500, *st.SubmitToResultP50MS, 1)
		require.InDelta(t, 1500, *st.SubmitToResultP95MS, 1, "one success is every percentile")
	})

	// Two successes (one after a retry), one dead after three attempts, one queued.
	ok1 := b.Create(t, jobstest.Opts{})
	b.Attempt(t, ok1.ID, jobs.Outcome{Status: jobs.StatusSucceeded})
	ok2 := b.Create(t, jobstest.Opts{})
	b.Attempt(t, ok2.ID, jobs.Outcome{Status: jobs.StatusRetrying})
	b.Attempt(t, ok2.ID, jobs.Outcome{Status: jobs.StatusSucceeded})
	b.Dead(t, jobstest.Opts{}, jobs.ReasonRetriesExhausted, 3)
	b.Create(t, jobstest.Opts{})
	// Submit → result of 1s and 3s (from the submit's insert, where the timeout starts).
	const fromInsert = `deadline - timeout_ms * interval '1 millisecond'`
	_, err := b.Pool.Exec(ctx, `UPDATE jobs SET finished_at = `+fromInsert+` + interval '1 second' WHERE id = $1`, ok1.ID)
	require.NoError(t, err)
	_, err = b.Pool.Exec(ctx, `UPDATE jobs SET finished_at = `+fromInsert+` + interval '3 seconds' WHERE id = $1`, ok2.ID)
	require.NoError(t, err)

	st, err := b.Store.Stats(ctx, time.Hour)
	require.NoError(t, err)
	require.Equal(t, map[jobs.Status]int{"succeeded": 2, "dead": 1, "queued": 1}, st.ByStatus)
	require.Equal(t, 4, st.Submitted)
	require.Equal(t, 6, st.Attempts)
	require.Equal(t, 3, st.Retries)
	require.Equal(t, 2, st.Succeeded)
	require.InDelta(t, 0.5, *st.RetryRate, 1e-9)
	require.InDelta(t, 3.0, *st.RequestsPerSuccess, 1e-9)
	require.InDelta(t, 2000, *st.SubmitToResultP50MS, 1)
	require.InDelta(t, 2900, *st.SubmitToResultP95MS, 1)

	// A negative window starts after now (the successes above end 1 s and 3 s after they began).
	later, err := b.Store.Stats(ctx, -time.Hour)
	require.NoError(t, err)
	require.Equal(t, map[jobs.Status]int{"queued": 1}, later.ByStatus, "only what waits now in a window that starts later")
	require.Zero(t, later.Submitted)
	require.Zero(t, later.Succeeded)
	require.Nil(t, later.RequestsPerSuccess)
	require.Nil(t, later.SubmitToResultP50MS)
	require.Nil(t, later.SubmitToResultP95MS)
}

// TestStore_StatsCountsWhatHappenedInTheWindow: the jobs of a final status are those that ended
// in the window, whenever they were submitted; the unfinished ones are those waiting or running
// now, however old (a backlog submitted before the window is still a backlog); the jobs
// submitted are those created in the window.
func TestStore_StatsCountsWhatHappenedInTheWindow(t *testing.T) {
	t.Parallel()
	b := jobstest.New(t)
	ctx := t.Context()
	ago := func(id, column string, d time.Duration) {
		t.Helper()
		_, err := b.Pool.Exec(ctx, `UPDATE jobs SET `+column+` = now() - make_interval(secs => $2::bigint) WHERE id = $1`,
			id, int64(d/time.Second))
		require.NoError(t, err)
	}
	// Submitted two hours ago: one still queued, one that succeeded ten minutes ago, one that
	// died ninety minutes ago. Submitted half an hour ago: one that succeeded.
	oldQueued := b.Create(t, jobstest.Opts{})
	ago(oldQueued.ID, "created_at", 2*time.Hour)
	oldSucceeded := b.Finished(t, jobs.StatusSucceeded, "")
	ago(oldSucceeded, "created_at", 2*time.Hour)
	ago(oldSucceeded, "finished_at", 10*time.Minute)
	oldDead := b.Finished(t, jobs.StatusDead, "")
	ago(oldDead, "created_at", 2*time.Hour)
	ago(oldDead, "finished_at", 90*time.Minute)
	recent := b.Finished(t, jobs.StatusSucceeded, "")
	ago(recent, "created_at", 30*time.Minute)

	st, err := b.Store.Stats(ctx, time.Hour)
	require.NoError(t, err)
	require.Equal(t, map[jobs.Status]int{"queued": 1, "succeeded": 2}, st.ByStatus)
	require.Equal(t, 2, st.Succeeded)
	require.Equal(t, 1, st.Submitted)
}

func unfinishedIDs(us []jobs.Unfinished) []string {
	out := make([]string, len(us))
	for i, u := range us {
		out[i] = u.ID
	}
	return out
}

// TestStore_PageDead: the dead letters come a page at a time, most recently dead first and, for
// deaths of the same microsecond (a batch's jobs dead-lettered in one transaction), by ID, each
// once however the pages split them; a job retried between two pages leaves its page and shifts
// no other; Since and Reason filter as in PageDead.
func TestStore_PageDead(t *testing.T) {
	t.Parallel()
	b := jobstest.New(t)
	ctx := context.Background()
	var all []*jobs.Job
	for range 7 {
		all = append(all, b.Dead(t, jobstest.Opts{}, jobs.ReasonRetriesExhausted, 1))
	}
	b.Dead(t, jobstest.Opts{}, jobs.ReasonRateLimitedNoRetryAfter, 1) // another reason
	// Five die in the same microsecond, two earlier.
	same := time.Date(2020, 1, 2, 3, 4, 5, 6000, time.UTC)
	for i, j := range all {
		at := same
		if i >= 5 {
			at = same.Add(-time.Duration(i) * time.Second)
		}
		_, err := b.Pool.Exec(ctx, `UPDATE jobs SET finished_at = $2 WHERE id = $1`, j.ID, at)
		require.NoError(t, err)
	}
	want := ids(all[:5])
	slices.Sort(want)
	slices.Reverse(want)
	want = append(want, all[5].ID, all[6].ID)

	f := jobs.DeadFilter{Reason: jobs.ReasonRetriesExhausted, Limit: 2}
	var got []string
	after := ""
	for range 10 {
		p, err := b.Store.PageDead(ctx, f, after)
		require.NoError(t, err)
		got = append(got, ids(p.Jobs)...)
		if p.Next == "" {
			break
		}
		after = p.Next
	}
	require.Equal(t, want, got)

	// A job retried between two pages: the next page starts where the first ended.
	p, err := b.Store.PageDead(ctx, f, "")
	require.NoError(t, err)
	require.Equal(t, want[:2], ids(p.Jobs))
	retried, err := b.Store.RetryDead(ctx, jobs.DeadFilter{IDs: []string{want[1]}}, nil)
	require.NoError(t, err)
	require.Len(t, retried, 1)
	p, err = b.Store.PageDead(ctx, f, p.Next)
	require.NoError(t, err)
	require.Equal(t, want[2:4], ids(p.Jobs))

	p, err = b.Store.PageDead(ctx, jobs.DeadFilter{Reason: jobs.ReasonRetriesExhausted, Since: same}, "")
	require.NoError(t, err)
	require.Len(t, p.Jobs, 4, "the five of the same microsecond, less the one retried")
	require.Empty(t, p.Next)
	_, err = b.Store.PageDead(ctx, f, "bm90LWEtY3Vyc29y")
	require.ErrorIs(t, err, jobs.ErrBadCursor)
}

// TestStore_RetryDeadSkipsRevokedTenants: a revoked tenant's dead letters are not sent again by
// a retry, by ID or of all (the tenant can no longer read the answers it would pay for), and
// CountDeadOfRevoked says how many of a filter's were so left.
func TestStore_RetryDeadSkipsRevokedTenants(t *testing.T) {
	t.Parallel()
	b := jobstest.New(t)
	ctx := t.Context()
	_, err := b.Pool.Exec(ctx, `INSERT INTO tenants (name, token_sha256, revoked_at) VALUES
	('gone', sha256('gone'), now()), ('live', sha256('live'), NULL)`)
	require.NoError(t, err)
	gone := b.Dead(t, jobstest.Opts{Tenant: "gone"}, jobs.ReasonRetriesExhausted, 1)
	gone2 := b.Dead(t, jobstest.Opts{Tenant: "gone"}, jobs.ReasonRetriesExhausted, 1)
	live := b.Dead(t, jobstest.Opts{Tenant: "live"}, jobs.ReasonRetriesExhausted, 1)
	unnamed := b.Dead(t, jobstest.Opts{}, jobs.ReasonRetriesExhausted, 1) // "default": no tenants row

	got, err := b.Store.RetryDead(ctx, jobs.DeadFilter{IDs: []string{gone.ID}}, nil)
	require.NoError(t, err)
	require.Empty(t, got, "a revoked tenant's dead letter, named")

	got, err = b.Store.RetryDead(ctx, jobs.DeadFilter{}, nil)
	require.NoError(t, err)
	ids := []string{}
	for _, u := range got {
		ids = append(ids, u.ID)
	}
	require.ElementsMatch(t, []string{live.ID, unnamed.ID}, ids)
	for _, id := range []string{gone.ID, gone2.ID} {
		j, err := b.Store.Get(ctx, id)
		require.NoError(t, err)
		require.Equal(t, jobs.StatusDead, j.Status)
	}

	n, err := b.Store.CountDeadOfRevoked(ctx, jobs.DeadFilter{})
	require.NoError(t, err)
	require.Equal(t, 2, n)
	n, err = b.Store.CountDeadOfRevoked(ctx, jobs.DeadFilter{IDs: []string{gone.ID, live.ID}})
	require.NoError(t, err)
	require.Equal(t, 1, n)
	n, err = b.Store.CountDeadOfRevoked(ctx, jobs.DeadFilter{Reason: jobs.ReasonRateLimitedNoRetryAfter})
	require.NoError(t, err)
	require.Equal(t, 0, n)
}

// TestStore_RetryDeadJobsUsageIsItsNewAnswers: a dead job given a late answer's usage
// (keepLateUsage) and then retried kept that usage, and showed it as the job's once the retry's
// answer, which reported none, succeeded: the job's usage is its answer's, NULL when the answer
// reported none. The late answer's usage stays on its attempt's row.
func TestStore_RetryDeadJobsUsageIsItsNewAnswers(t *testing.T) {
	t.Parallel()
	b := jobstest.New(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	job := b.Dead(t, jobstest.Opts{}, jobs.ReasonRetriesExhausted, 1)
	late := json.RawMessage(`{"input_tokens":7,"output_tokens":9}`)
	applied, err := b.Store.Finish(ctx, job.ID, &jobs.Attempt{Number: 2, Credential: "default", StartedAt: time.Now(),
		Class: "ok", StatusCode: 200}, jobs.Outcome{Status: jobs.StatusSucceeded, Result: json.RawMessage(`{"x":1}`), Usage: late})
	require.NoError(t, err)
	require.False(t, applied, "the answer came after the job died")
	j, err := b.Store.Get(ctx, job.ID)
	require.NoError(t, err)
	require.JSONEq(t, string(late), string(j.Usage), "the late answer's usage, kept as the dead job's")

	_, err = b.Store.RetryDead(ctx, jobs.DeadFilter{IDs: []string{job.ID}}, nil)
	require.NoError(t, err)
	j, err = b.Store.Get(ctx, job.ID)
	require.NoError(t, err)
	require.Nil(t, j.Usage, "a retried job has no answer yet")

	b.Attempt(t, job.ID, jobs.Outcome{Status: jobs.StatusSucceeded, Result: json.RawMessage(`{"ok":true}`)})
	j, err = b.Store.Get(ctx, job.ID)
	require.NoError(t, err)
	require.Equal(t, jobs.StatusSucceeded, j.Status)
	require.Nil(t, j.Usage, "the retry's answer reported no usage")
	attempts, err := b.Store.Attempts(ctx, job.ID)
	require.NoError(t, err)
	require.Len(t, attempts, 3)
	require.JSONEq(t, string(late), string(attempts[1].Usage), "the late answer's cost stays on its attempt")
	require.Nil(t, attempts[2].Usage)
}

// TestStore_StatsCountsARetriedDeadLetterFromItsRetry: a dead letter an operator retries a month
// after its submit, and that then succeeds, took the seconds since its retry, not a month: its
// submit → result counts from the retry, where its new timeout starts. From created_at it
// showed as a p95 of 744h.
func TestStore_StatsCountsARetriedDeadLetterFromItsRetry(t *testing.T) {
	t.Parallel()
	b := jobstest.New(t)
	ctx := t.Context()
	dead := b.Dead(t, jobstest.Opts{}, jobs.ReasonRetriesExhausted, 1)
	_, err := b.Pool.Exec(ctx, `UPDATE jobs SET created_at = now() - interval '31 days', deadline = deadline - interval '31 days',
	finished_at = now() - interval '30 days' WHERE id = $1`, dead.ID)
	require.NoError(t, err)
	retried, err := b.Store.RetryDead(ctx, jobs.DeadFilter{IDs: []string{dead.ID}}, nil)
	require.NoError(t, err)
	require.Len(t, retried, 1)
	b.Attempt(t, dead.ID, jobs.Outcome{Status: jobs.StatusSucceeded})

	st, err := b.Store.Stats(ctx, time.Hour)
	require.NoError(t, err)
	require.Equal(t, 1, st.Succeeded)
	require.NotNil(t, st.SubmitToResultP95MS)
	require.Less(t, *st.SubmitToResultP95MS, float64(time.Minute.Milliseconds()), "from the retry")
	require.GreaterOrEqual(t, *st.SubmitToResultP95MS, 0.0)
}
