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
)

// TestCancel_OneTenantsFloodLeavesRoomForOthers: a cancel's statement locks its job's row,
// holding a pool connection while it waits for another transaction holding it (another cancel of
// the job, a worker's transition; here: one outside the pool, a stand-in for either). Tenant a's
// flood of DELETEs of its job took every connection of the pool, and tenant b's poll waited
// behind them until its bound: 503 overloaded, for a's doing. Now a's cancels hold at most half
// the pool (api.max_keyed_submits_per_tenant's places, which a's keyed submits share), their
// excess is a 429 of a's own (too_many_cancels, Retry-After, counted and logged under its name)
// and b's poll is served.
func TestCancel_OneTenantsFloodLeavesRoomForOthers(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	var logs logtest.Buffer
	dbURL := pgtest.URL(t)
	b := setup(t, setupOpts{dbURL: dbURL + "&pool_max_conns=4", noListener: true,
		storeWait: 2 * time.Second, tenantTTL: time.Hour, registry: reg,
		logger: slog.New(slog.NewTextHandler(&logs, nil))})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	_, tokenA, err := b.tenants.Create(ctx, "a", nil)
	require.NoError(t, err)
	_, tokenB, err := b.tenants.Create(ctx, "b", nil)
	require.NoError(t, err)
	job := b.create(t, "a")
	missing := "/v1/jobs/" + uuid.NewString()
	// Both tokens' lookups cached, so that the requests need Postgres for their jobs only.
	for _, tok := range []string{tokenA, tokenB} {
		require.Equal(t, "404 not_found", requestWith(ctx, b.url, http.MethodGet, missing, tok).code)
	}

	// A transaction outside the pool locks a's job's row: every cancel of it waits in Postgres.
	conn, err := pgx.Connect(ctx, dbURL)
	require.NoError(t, err)
	defer conn.Close(context.Background())
	var wg sync.WaitGroup
	defer wg.Wait() // after the rollback, which ends the cancels still waiting
	tx, err := conn.Begin(ctx)
	require.NoError(t, err)
	rollback := sync.OnceFunc(func() { require.NoError(t, tx.Rollback(ctx)) })
	defer rollback()
	_, err = tx.Exec(ctx, `SELECT 1 FROM jobs WHERE id = $1 FOR UPDATE`, job.ID)
	require.NoError(t, err)
	watch, err := pgx.Connect(ctx, dbURL)
	require.NoError(t, err)
	defer watch.Close(context.Background())

	const flood = 4 // the pool's size
	answers := make(chan submitAnswer, flood)
	for range flood {
		wg.Go(func() { answers <- requestWith(ctx, b.url, http.MethodDelete, "/v1/jobs/"+job.ID, tokenA) })
	}
	// Every cancel of a's is either waiting for the row in Postgres or answered.
	answered := pgtest.LockWaitingOrAnswered(ctx, t, watch, answers, flood, "a's cancels")

	// b is served while a's flood holds on.
	got := requestWith(ctx, b.url, http.MethodGet, missing, tokenB)
	require.Equal(t, "404 not_found", got.code, "tenant b's poll while tenant a's cancels flood: %s", got.body)

	// a's excess was refused as a's own: 429, named, with Retry-After, counted under its name.
	require.Len(t, answered, flood/2)
	for _, a := range answered {
		require.Equal(t, "429 too_many_cancels", a.code, a.body)
		require.Equal(t, "1", a.retryAfter)
		require.Contains(t, a.body, `tenant \"a\"`)
	}
	require.EqualValues(t, flood/2, testutil.ToFloat64(gatheredCounter(t, reg, "llmq_http_tenant_refusals_total", "tenant", "a")))
	require.Equal(t, 1, logs.Count("tenant over its share; refused"), logs.String())
	require.Contains(t, logs.String(), "tenant=a anonymous=false type=too_many_cancels")

	// a's keyed submits share those places: a flood of both kinds holds no more of the pool.
	keyed := submitWith(ctx, b.url, `{"request":{"model":"m"}}`, "a-1", tokenA)
	require.Equal(t, "429 too_many_submits", keyed.code, keyed.body)

	// The row free, a's cancels under way end: one cancels the job, the other finds it canceled.
	rollback()
	for range flood - len(answered) {
		select {
		case a := <-answers:
			require.Equal(t, "200 ", a.code, a.body)
			require.Contains(t, a.body, `"status":"canceled"`)
		case <-ctx.Done():
			t.Fatal("a's cancels under way did not end")
		}
	}
}
