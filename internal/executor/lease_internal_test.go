package executor

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
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
	pool, store, job := begunJob(ctx, t)
	leaseUntil := func() (u time.Time, err error) {
		err = pool.QueryRow(ctx, `SELECT lease_until FROM jobs WHERE id = $1`, job.ID).Scan(&u)
		return u, err
	}

	e := New(Config{Store: store, LeaseRenewInterval: time.Millisecond})
	for round := range 20 {
		began, err := leaseUntil()
		require.NoError(t, err)
		lease := e.keepLease(ctx, job, nil)
		require.Eventually(t, func() bool {
			u, err := leaseUntil()
			return err == nil && u.After(began)
		}, 30*time.Second, time.Millisecond, "round %d: the lease was never renewed", round)

		lease.stop()
		held, err := leaseUntil()
		require.NoError(t, err)
		lease.renew() // a renewal that fires after stop, as its timer may have: it must not renew
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
	h := startHangingDelivery(ctx, t, "sk-moved-on")
	_, err := h.store.Cancel(ctx, h.job.ID) // in Postgres only: no abort reaches the delivery
	require.NoError(t, err)

	h.wait(ctx, t, "a canceled job")
	after, err := h.store.Get(ctx, h.job.ID)
	require.NoError(t, err)
	require.Equal(t, jobs.StatusCanceled, after.Status)
	attempts, err := h.store.Attempts(ctx, h.job.ID)
	require.NoError(t, err)
	require.Len(t, attempts, 1, "the call made is recorded")
}

// hangingDelivery is a delivery of a job of its own whose call waits for an answer that never
// comes, until its client leaves (startHangingDelivery).
type hangingDelivery struct {
	pool  *pgxpool.Pool
	store *jobs.Store
	job   *jobs.Job
	left  chan struct{}
	done  chan error
}

// startHangingDelivery starts the delivery (its lease renewed every 10 ms) and returns once its
// call reached the provider.
func startHangingDelivery(ctx context.Context, t *testing.T, key string) *hangingDelivery {
	t.Helper()
	got := make(chan struct{})
	h := &hangingDelivery{left: make(chan struct{}), done: make(chan error, 1)}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body) // read whole: the server then notices the client leave
		close(got)
		select { // the answer never comes; the call ends when its client leaves
		case <-r.Context().Done():
			close(h.left)
		case <-ctx.Done():
		}
	}))
	t.Cleanup(srv.Close)
	p, err := llm.New(llm.Config{Kind: llm.KindAnthropic, BaseURL: srv.URL, APIKey: key})
	require.NoError(t, err)
	h.pool = pgtest.Pool(t)
	h.store = jobs.NewStore(h.pool, nil)
	h.job, _, err = h.store.Create(ctx, jobs.CreateParams{Tenant: "default", Credential: "c",
		Request: json.RawMessage(`{"model":"m","max_tokens":8,"messages":[]}`), MaxAttempts: 3, Timeout: time.Hour})
	require.NoError(t, err)
	e := New(Config{Store: h.store, Upstreams: map[string]Upstream{"c": {Name: "c", Kind: string(llm.KindAnthropic), Provider: p}},
		LeaseRenewInterval: 10 * time.Millisecond})
	go func() { h.done <- e.Process(ctx, dispatch.Delivery{JobID: h.job.ID}) }()
	select {
	case <-got:
	case <-ctx.Done():
		t.Fatal("the call was never made")
	}
	return h
}

// wait requires the call stopped (its client left) and the delivery ended without an error.
func (h *hangingDelivery) wait(ctx context.Context, t *testing.T, what string) {
	t.Helper()
	select {
	case <-h.left:
	case <-ctx.Done():
		t.Fatalf("the call went on for %s", what)
	}
	select {
	case err := <-h.done:
		require.NoError(t, err)
	case <-ctx.Done():
		t.Fatal("the delivery did not end")
	}
}

// TestAttempt_StoppedForAnotherDeliveryLeavesItTheJob: a delivery whose lease another delivery
// took over (its renewal finds the lease not its own) stops its call, records the attempt it
// made, and ends without moving the job or asking to come back: the job is the other's, whose
// call is under way. (A lost lease taken for the call's own failure moved the job to failed.)
func TestAttempt_StoppedForAnotherDeliveryLeavesItTheJob(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	h := startHangingDelivery(ctx, t, "sk-taken-over")
	// Another delivery takes the lease over (as BeginAttempt does once a lease has run out).
	const other = "0195f4c2-7b1e-7000-8000-0000000000cc"
	_, err := h.pool.Exec(ctx, `UPDATE jobs SET lease_token = $2::uuid, attempts = attempts + 1,
		lease_until = clock_timestamp() + interval '1 hour' WHERE id = $1`, h.job.ID, other)
	require.NoError(t, err)

	h.wait(ctx, t, "a job another delivery holds")
	after, err := h.store.Get(ctx, h.job.ID)
	require.NoError(t, err)
	require.Equal(t, jobs.StatusRunning, after.Status, "the job is not moved")
	require.NotNil(t, after.LeaseToken)
	require.Equal(t, other, *after.LeaseToken, "the other delivery keeps its lease")
	require.Nil(t, after.NextAttemptAt, "no retry is scheduled beside the other's call")
	attempts, err := h.store.Attempts(ctx, h.job.ID)
	require.NoError(t, err)
	require.Len(t, attempts, 1, "the call made is recorded")
}

// begunJob returns a job whose first attempt began (its lease held), in a store of its own.
func begunJob(ctx context.Context, t *testing.T) (*pgxpool.Pool, *jobs.Store, *jobs.Job) {
	t.Helper()
	pool := pgtest.Pool(t)
	store := jobs.NewStore(pool, nil)
	job, _, err := store.Create(ctx, jobs.CreateParams{Tenant: "default", Credential: "c",
		Request: json.RawMessage(`{"model":"m"}`), MaxAttempts: 3, Timeout: time.Hour})
	require.NoError(t, err)
	job, err = store.BeginAttempt(ctx, job.ID)
	require.NoError(t, err)
	require.NotNil(t, job.LeaseToken)
	return pool, store, job
}

// TestKeepLease_LostLeaseCancelsWithErrLeaseLost: a renewal that finds the lease another
// delivery's cancels the attempt with errLeaseLost as its cause, which is how attempt tells a
// call stopped for nobody from one that failed (see TestAttempt_StoppedForAnotherDeliveryLeavesItTheJob);
// it does so once, and renews no more.
func TestKeepLease_LostLeaseCancelsWithErrLeaseLost(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	_, store, job := begunJob(ctx, t)
	// This delivery holds a token that is not the job's: another delivery took the lease over.
	other := *job
	token := "0195f4c2-7b1e-7000-8000-0000000000bb"
	other.LeaseToken = &token

	e := New(Config{Store: store, LeaseRenewInterval: time.Millisecond})
	callCtx, abort := context.WithCancelCause(ctx)
	defer abort(nil)
	calls := make(chan error, 10)
	lease := e.keepLease(ctx, &other, func(cause error) {
		calls <- cause
		abort(cause)
	})
	select {
	case <-callCtx.Done():
	case <-ctx.Done():
		t.Fatal("the lost lease never stopped the call")
	}
	lease.stop()
	require.ErrorIs(t, context.Cause(callCtx), errLeaseLost, "the call's cause")
	require.Len(t, calls, 1, "lost is called once")
	require.Equal(t, errLeaseLost, <-calls)
}

// TestKeepLease_StopWaitsForTheRenewalUnderWay: stop returns only once a renewal under way has
// ended (here: its UPDATE waits for a row lock held by the test): a lease that moved after stop
// returned would outlive the attempt's record.
func TestKeepLease_StopWaitsForTheRenewalUnderWay(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	pool, store, job := begunJob(ctx, t)
	var before time.Time
	require.NoError(t, pool.QueryRow(ctx, `SELECT lease_until FROM jobs WHERE id = $1`, job.ID).Scan(&before))

	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	_, err = tx.Exec(ctx, `SELECT 1 FROM jobs WHERE id = $1 FOR UPDATE`, job.ID)
	require.NoError(t, err)

	e := New(Config{Store: store, LeaseRenewInterval: time.Millisecond})
	lease := e.keepLease(ctx, job, nil)
	// The renewal is under way once its UPDATE waits for the test's lock.
	require.Eventually(t, func() bool {
		var n int
		err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'
			AND query LIKE 'UPDATE jobs SET lease_until%' AND datname = current_database()`).Scan(&n)
		return err == nil && n == 1
	}, 30*time.Second, time.Millisecond, "no renewal waited for the lock")
	stopped := make(chan struct{})
	go func() {
		lease.stop()
		close(stopped)
	}()
	select {
	case <-stopped:
		t.Fatal("stop returned while its renewal waited for the lock")
	default:
	}
	require.NoError(t, tx.Commit(ctx))
	select {
	case <-stopped:
	case <-ctx.Done():
		t.Fatal("stop never returned")
	}
	var after time.Time
	require.NoError(t, pool.QueryRow(ctx, `SELECT lease_until FROM jobs WHERE id = $1`, job.ID).Scan(&after))
	require.True(t, after.After(before), "stop returned before its renewal committed")
}
