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
		stop := e.keepLease(ctx, job)
		require.Eventually(t, func() bool {
			u, err := leaseUntil()
			return err == nil && u.After(began)
		}, 10*time.Second, time.Millisecond, "round %d: the lease was never renewed", round)

		stop()
		held, err := leaseUntil()
		require.NoError(t, err)
		time.Sleep(10 * time.Millisecond) // ten renewals' time: any renewal left running would show
		after, err := leaseUntil()
		require.NoError(t, err)
		require.Equal(t, held, after, "round %d: the lease was renewed after stop", round)
	}
}
