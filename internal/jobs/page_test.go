package jobs_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/jobs"
	"github.com/llmq/llmq/internal/jobstest"
)

// TestStore_PageWithAFilterStopsItsRead: a page whose status or credential filter matches few
// jobs or none reads at most 10,000 jobs (jobs.PageScanRows) from its cursor, newest first, and
// ends there with what it found and a cursor that goes on: a filter matching nothing no longer
// reads the whole table for one page. Paging on finds every match, once, and ends.
func TestStore_PageWithAFilterStopsItsRead(t *testing.T) {
	t.Parallel()
	b := jobstest.New(t)
	ctx := t.Context()
	// 25,000 jobs of credential c; the oldest but one is of credential rare.
	_, err := b.Pool.Exec(ctx, `INSERT INTO jobs (id, credential, fingerprint, status, request, max_attempts, timeout_ms, deadline, created_at)
SELECT gen_random_uuid(), CASE WHEN g = 24999 THEN 'rare' ELSE 'c' END, 'f', 'succeeded', '{}', 3, 60000, now(),
	now() - g * interval '1 millisecond'
FROM generate_series(1, 25000) g`)
	require.NoError(t, err)

	page, err := b.Store.Page(ctx, jobs.PageParams{Credential: "nope"})
	require.NoError(t, err)
	require.Empty(t, page.Jobs)
	require.NotEmpty(t, page.Next, "the read stopped short of the table's end, and says where to go on")

	var found []string
	pages := 0
	for p := (jobs.PageParams{Credential: "rare", Limit: 5}); ; pages++ {
		require.Less(t, pages, 10)
		page, err := b.Store.Page(ctx, p)
		require.NoError(t, err)
		for _, j := range page.Jobs {
			found = append(found, j.Credential)
		}
		if page.Next == "" {
			break
		}
		p.After = page.Next
	}
	require.Equal(t, []string{"rare"}, found)
	require.Equal(t, 2, pages, "10,000 jobs, 10,000 more, then the last 5,000 and the end")

	// Without a filter, or with a page's worth of matches, a page is full as before.
	page, err = b.Store.Page(ctx, jobs.PageParams{Credential: "c", Limit: 500})
	require.NoError(t, err)
	require.Len(t, page.Jobs, 500)
	page, err = b.Store.Page(ctx, jobs.PageParams{Limit: 500, After: page.Next})
	require.NoError(t, err)
	require.Len(t, page.Jobs, 500)
}

// TestStore_ListsReadNoRequestNorAnswer: the lists (the console's job and dead-letter pages, ctl
// jobs list and dead list) read no job's request, which no list shows (it is not in the job
// JSON), and the console's job page no answer either, which it drops (a row of the list shows
// none): a page of 500 jobs whose answers weighed 800 kB each took 1.2 to 2 s where a page of
// small ones took 0.06 s, as Postgres read and sent 380 MB for it.
func TestStore_ListsReadNoRequestNorAnswer(t *testing.T) {
	t.Parallel()
	b := jobstest.New(t)
	ctx := t.Context()
	_, err := b.Pool.Exec(ctx, `INSERT INTO jobs (id, credential, fingerprint, status, request, result, max_attempts,
	timeout_ms, deadline, dead_reason, finished_at)
VALUES (gen_random_uuid(), 'c', 'f', 'succeeded', '{"prompt": "long"}', '{"answer": "long"}', 3, 60000, now(), NULL, now()),
	(gen_random_uuid(), 'c', 'f', 'dead', '{"prompt": "long"}', '{"late": "answer"}', 3, 60000, now(), 'retries_exhausted', now())`)
	require.NoError(t, err)

	page, err := b.Store.Page(ctx, jobs.PageParams{})
	require.NoError(t, err)
	require.Len(t, page.Jobs, 2)
	for _, j := range page.Jobs {
		require.Nil(t, j.Request, "job %s", j.Status)
		require.Nil(t, j.Result, "job %s", j.Status)
		require.JSONEq(t, `{}`, string(j.Metadata), "the other columns are read as before")
	}

	dead, err := b.Store.PageDead(ctx, jobs.DeadFilter{}, "")
	require.NoError(t, err)
	require.Len(t, dead.Jobs, 1)
	require.Nil(t, dead.Jobs[0].Request)
	require.JSONEq(t, `{"late": "answer"}`, string(dead.Jobs[0].Result), "ctl dead list --json prints it")

	list, err := b.Store.List(ctx, jobs.ListParams{})
	require.NoError(t, err)
	require.Len(t, list, 2)
	for _, j := range list {
		require.Nil(t, j.Request, "job %s", j.Status)
		require.NotNil(t, j.Result, "ctl jobs list --json prints the answer of job %s", j.Status)
	}
}
