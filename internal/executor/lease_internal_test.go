package executor

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/jobs"
	"github.com/llmq/llmq/internal/pgtest"
)

// TestKeepLease_RenewsUntilStopped: a held attempt's lease is pushed out while the call runs, and
// no more once the attempt stops holding it.
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
	began, err := leaseUntil()
	require.NoError(t, err)

	e := New(Config{Store: store})
	e.renewEvery = 10 * time.Millisecond
	stop := e.keepLease(ctx, job)
	require.Eventually(t, func() bool {
		u, err := leaseUntil()
		return err == nil && u.After(began)
	}, 10*time.Second, 5*time.Millisecond, "the lease was never renewed")

	stop()
	held, err := leaseUntil()
	require.NoError(t, err)
	time.Sleep(10 * e.renewEvery) // ten renewals' time: any renewal left running would show
	after, err := leaseUntil()
	require.NoError(t, err)
	require.Equal(t, held, after, "the lease was renewed after stop")
}
