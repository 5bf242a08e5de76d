package tenant_test

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/clocktest"
	"github.com/llmq/llmq/internal/pgtest"
	"github.com/llmq/llmq/internal/tenant"
)

// lookupCounter counts the token lookups a pool runs (the driver's query hook).
type lookupCounter struct{ n atomic.Int64 }

func (c *lookupCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if strings.Contains(d.SQL, "WHERE token_sha256 = $1") {
		c.n.Add(1)
	}
	return ctx
}

func (c *lookupCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// TestAuthenticator_ConcurrentMissesLookUpOnce: a burst of requests with one token that is not
// cached (the first burst after a start, or each time the answer's TTL ends under load) makes
// one lookup, which the others wait for, not one lookup each: 30 concurrent requests took 30 of
// the pool's connections, ahead of the submits' own statements. So too for an unknown token,
// whose answer the waiters find in the cache of unknown tokens.
func TestAuthenticator_ConcurrentMissesLookUpOnce(t *testing.T) {
	t.Parallel()
	t.Run("known", func(t *testing.T) {
		t.Parallel()
		testConcurrentMissesLookUpOnce(t, true)
	})
	t.Run("unknown", func(t *testing.T) {
		t.Parallel()
		testConcurrentMissesLookUpOnce(t, false)
	})
}

func testConcurrentMissesLookUpOnce(t *testing.T, known bool) {
	const burst = 30
	pcfg, err := pgxpool.ParseConfig(pgtest.URL(t) + "&pool_max_conns=40")
	require.NoError(t, err)
	counter := &lookupCounter{}
	pcfg.ConnConfig.Tracer = counter
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	store := tenant.NewStore(pool, nil)
	want := "acme"
	_, token, err := store.Create(ctx, "acme", nil)
	require.NoError(t, err)
	if !known {
		// A well-formed token of another database's tenant.
		_, token, err = tenant.NewStore(pgtest.Pool(t), nil).Create(ctx, "other", nil)
		require.NoError(t, err)
		want = tenant.ErrUnknownBearerToken.Error()
	}
	clock := clocktest.New(time.Unix(1_700_000_000, 0))
	auth := tenant.NewAuthenticator(store, &tenant.AuthenticatorConfig{Now: clock.Now})

	// The lookups wait on a lock of the table until every request has begun its own or joined one.
	lock, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = lock.Rollback(context.Background()) }()
	_, err = lock.Exec(ctx, `LOCK TABLE tenants IN ACCESS EXCLUSIVE MODE`)
	require.NoError(t, err)

	names := make(chan string, burst)
	var wg sync.WaitGroup
	for range burst {
		wg.Go(func() {
			got, err := auth.Authenticate(ctx, token)
			if err != nil {
				names <- err.Error()
				return
			}
			names <- got.Name
		})
	}
	require.Eventually(t, func() bool { return int(counter.n.Load())+auth.Joined() == burst },
		30*time.Second, time.Millisecond, "every request looked up or joined a lookup")
	require.NoError(t, lock.Rollback(ctx))
	wg.Wait()
	close(names)
	for n := range names {
		require.Equal(t, want, n)
	}
	require.EqualValues(t, 1, counter.n.Load(), "one lookup for the burst")
}

// TestAuthenticator_WaitersOutliveALookupWhoseClientLeft: a request waiting for another's lookup
// of its token is not failed when that other request's client leaves: it looks up itself.
func TestAuthenticator_WaitersOutliveALookupWhoseClientLeft(t *testing.T) {
	t.Parallel()
	pcfg, err := pgxpool.ParseConfig(pgtest.URL(t))
	require.NoError(t, err)
	counter := &lookupCounter{}
	pcfg.ConnConfig.Tracer = counter
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	store := tenant.NewStore(pool, nil)
	_, token, err := store.Create(ctx, "acme", nil)
	require.NoError(t, err)
	auth := tenant.NewAuthenticator(store, nil)
	lock, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = lock.Rollback(context.Background()) }()
	_, err = lock.Exec(ctx, `LOCK TABLE tenants IN ACCESS EXCLUSIVE MODE`)
	require.NoError(t, err)

	leaving, leave := context.WithCancel(ctx)
	left := make(chan error, 1)
	go func() {
		_, err := auth.Authenticate(leaving, token)
		left <- err
	}()
	require.Eventually(t, func() bool { return counter.n.Load() == 1 }, 30*time.Second, time.Millisecond)
	stayed := make(chan string, 1)
	go func() {
		got, err := auth.Authenticate(ctx, token)
		if err != nil {
			stayed <- err.Error()
			return
		}
		stayed <- got.Name
	}()
	require.Eventually(t, func() bool { return auth.Joined() == 1 }, 30*time.Second, time.Millisecond)
	leave()
	require.ErrorIs(t, <-left, context.Canceled)
	require.Eventually(t, func() bool { return counter.n.Load() == 2 }, 30*time.Second, time.Millisecond,
		"the waiter looks up itself")
	require.NoError(t, lock.Rollback(ctx))
	require.Equal(t, "acme", <-stayed)
}
