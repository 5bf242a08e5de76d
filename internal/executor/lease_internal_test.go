package executor

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/dispatch"
	"github.com/llmq/llmq/internal/jobs"
	"github.com/llmq/llmq/internal/llm"
	"github.com/llmq/llmq/internal/pgtest"
)

// TestKeepLease_RenewsUntilStopped: a held attempt's lease is pushed out while the call runs, and
// no more once stop has returned, even when stop comes while a renewal is under way (renewals
// every millisecond make that likely in most rounds: a renewal canceled mid-statement used to
// commit on the server after stop had returned).
func TestKeepLease_RenewsUntilStopped(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.Pool(t)
	store := jobs.NewStore(pool, nil)
	job, _, err := store.Create(ctx, jobs.CreateParams{Tenant: "default", Credential: "c",
		Request: json.RawMessage(`{"model":"m"}`), MaxAttempts: 3, Timeout: time.Hour})
	require.NoError(t, err)
	job, err = store.BeginAttempt(ctx, job.ID)
	require.NoError(t, err)
	require.NotNil(t, job.LeaseToken)
	leaseUntil := func() (u time.Time, err error) {
		err = pool.QueryRow(ctx, `SELECT lease_until FROM jobs WHERE id = $1`, job.ID).Scan(&u)
		return u, err
	}

	e := New(Config{Store: store})
	e.renewEvery = time.Millisecond
	for round := range 20 {
		began, err := leaseUntil()
		require.NoError(t, err)
		lease := e.keepLease(ctx, job, nil)
		require.Eventually(t, func() bool {
			u, err := leaseUntil()
			return err == nil && u.After(began)
		}, 10*time.Second, time.Millisecond, "round %d: the lease was never renewed", round)

		lease.stop()
		held, err := leaseUntil()
		require.NoError(t, err)
		time.Sleep(10 * time.Millisecond) // ten renewals' time: any renewal left running would show
		after, err := leaseUntil()
		require.NoError(t, err)
		require.Equal(t, held, after, "round %d: the lease was renewed after stop", round)
	}
}

// TestAttempt_StopsWhenTheJobMovesOn: a job canceled while its call runs, whose abort never
// reaches the delivery (asynq's signal goes through Redis), has its call stopped at the next
// renewal of its lease, which finds the job canceled: a long stream is not read to its end for
// nobody. The attempt is recorded; the job stays canceled.
func TestAttempt_StopsWhenTheJobMovesOn(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	got, left := make(chan struct{}), make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body) // read whole: the server then notices the client leave
		close(got)
		select { // the answer never comes; the call ends when its client leaves
		case <-r.Context().Done():
			close(left)
		case <-ctx.Done():
		}
	}))
	t.Cleanup(srv.Close)
	p, err := llm.New(llm.Config{Kind: llm.KindAnthropic, BaseURL: srv.URL, APIKey: "sk-moved-on"})
	require.NoError(t, err)
	store := jobs.NewStore(pgtest.Pool(t), nil)
	job, _, err := store.Create(ctx, jobs.CreateParams{Tenant: "default", Credential: "c",
		Request: json.RawMessage(`{"model":"m","max_tokens":8,"messages":[]}`), MaxAttempts: 3, Timeout: time.Hour})
	require.NoError(t, err)
	e := New(Config{Store: store, Upstreams: map[string]Upstream{"c": {Name: "c", Kind: string(llm.KindAnthropic), Provider: p}}})
	e.renewEvery = 10 * time.Millisecond

	done := make(chan error, 1)
	go func() { done <- e.Process(ctx, dispatch.Delivery{JobID: job.ID}) }()
	select {
	case <-got:
	case <-ctx.Done():
		t.Fatal("the call was never made")
	}
	_, err = store.Cancel(ctx, job.ID) // in Postgres only: no abort reaches the delivery
	require.NoError(t, err)

	select {
	case <-left:
	case <-ctx.Done():
		t.Fatal("the call went on for a canceled job")
	}
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-ctx.Done():
		t.Fatal("the delivery did not end")
	}
	after, err := store.Get(ctx, job.ID)
	require.NoError(t, err)
	require.Equal(t, jobs.StatusCanceled, after.Status)
	attempts, err := store.Attempts(ctx, job.ID)
	require.NoError(t, err)
	require.Len(t, attempts, 1, "the call made is recorded")
}
