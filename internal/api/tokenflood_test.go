package api

import (
	"context"
	"log/slog"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/logtest"
	"github.com/llmq/llmq/internal/pgtest"
	"github.com/llmq/llmq/internal/secrettoken"
	"github.com/llmq/llmq/internal/tenant"
)

// TestAuth_UnknownTokenFloodLeavesRoomForOthers: a request with a bearer token the API has no
// answer for costs a Postgres lookup on a pool connection, before any tenant's limit applies. A
// client without any token of ours, sending made-up well-formed ones (each new, so none is
// cached), took as many pool connections as it had requests in flight, each held as long as
// Postgres took to answer (here: behind a lock of the tenants table, a stand-in for a slow
// Postgres), and tenant b's poll waited behind them until its bound: 503 overloaded. Now the
// lookups of new tokens hold at most a quarter of the pool (one of four); the flood's excess waits
// for one of those places up to its bound (503 overloaded, nothing sent to Postgres), and b's poll
// is served. The flood's lookup, once Postgres answers, is a 401 as ever.
//
// The operator sees the flood's 503s for what they are: counted apart
// (llmq_http_token_lookups_refused_total) and logged once a minute, where the pool's own metrics
// show a pool with room (a quarter of it in use) and the 503s were otherwise counted and
// unlogged like those of a saturated pool.
func TestAuth_UnknownTokenFloodLeavesRoomForOthers(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.URL(t)
	reg := prometheus.NewRegistry()
	var logs logtest.Buffer
	// The bound leaves a loaded machine time to open a pool connection for b's poll.
	b := setup(t, setupOpts{dbURL: dbURL + "&pool_max_conns=4", noListener: true,
		storeWait: 2 * time.Second, tenantTTL: time.Hour, registry: reg,
		logger: slog.New(slog.NewTextHandler(&logs, nil))})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	_, tokenB, err := b.tenants.Create(ctx, "b", nil)
	require.NoError(t, err)
	missing := "/v1/jobs/" + uuid.NewString()
	// b's token is cached: its poll needs Postgres for the job's read only.
	require.Equal(t, "404 not_found", requestWith(ctx, b.url, http.MethodGet, missing, tokenB).code)

	// A transaction outside the pool locks the tenants table: every token lookup waits for it in
	// Postgres, holding its connection. The jobs table is not locked.
	conn, err := pgx.Connect(ctx, dbURL)
	require.NoError(t, err)
	defer conn.Close(context.Background())
	var wg sync.WaitGroup
	defer wg.Wait() // after the rollback, which ends the lookups still waiting
	tx, err := conn.Begin(ctx)
	require.NoError(t, err)
	rollback := sync.OnceFunc(func() { require.NoError(t, tx.Rollback(ctx)) })
	defer rollback()
	_, err = tx.Exec(ctx, `LOCK TABLE tenants IN ACCESS EXCLUSIVE MODE`)
	require.NoError(t, err)
	watch, err := pgx.Connect(ctx, dbURL)
	require.NoError(t, err)
	defer watch.Close(context.Background())

	const flood = 4 // the pool's size
	answers := make(chan submitAnswer, flood)
	for range flood {
		token, err := secrettoken.New(nil, tenant.BearerTokenPrefix)
		require.NoError(t, err)
		wg.Go(func() { answers <- requestWith(ctx, b.url, http.MethodGet, missing, token) })
	}
	// Every lookup of the flood is either waiting in Postgres or answered.
	answered := pgtest.LockWaitingOrAnswered(ctx, t, watch, answers, flood, "the flood's lookups")

	// b is served while the flood holds on.
	got := requestWith(ctx, b.url, http.MethodGet, missing, tokenB)
	require.Equal(t, "404 not_found", got.code, "tenant b's poll while unknown tokens flood: %s", got.body)

	// The flood's excess waited for a place among the lookups up to its bound: 503 overloaded.
	require.Len(t, answered, flood-1, "a quarter of the pool (one connection) looks tokens up")
	for _, a := range answered {
		require.Equal(t, "503 overloaded", a.code, a.body)
		require.Equal(t, "1", a.retryAfter)
	}
	require.Equal(t, 1, testutil.CollectAndCount(reg, "llmq_http_token_lookups_refused_total"), "the refusals at the lookups' cap are counted")
	require.EqualValues(t, flood-1, gatheredValue(t, reg, "llmq_http_token_lookups_refused_total"))
	require.Equal(t, 1, logs.Count("lookups of bearer tokens never known hold their share of the pool; refused"), logs.String())
	require.Contains(t, logs.String(), "suppressed=0")
	rollback()
	select {
	case a := <-answers:
		require.Equal(t, "401 unauthorized", a.code, a.body)
	case <-ctx.Done():
		t.Fatal("the flood's lookup in Postgres did not end")
	}
}

// gatheredValue is the value of the counter name, which has no labels, in reg.
func gatheredValue(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) == 1 {
			return mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	t.Fatalf("no %s", name)
	return 0
}

// requestWith sends method path as the token's tenant (anonymous without one) and returns its
// answer, or what went wrong as its code. It is safe to call from any goroutine.
func requestWith(ctx context.Context, base, method, path, token string) submitAnswer {
	return sendAs(ctx, method, base+path, nil, "", token)
}
