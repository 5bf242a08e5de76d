package api

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/hibiken/asynq"
	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/dispatch"
	"github.com/llmq/llmq/internal/idem"
	"github.com/llmq/llmq/internal/logtest"
	"github.com/llmq/llmq/internal/pgtest"
	"github.com/llmq/llmq/internal/redistest"
	"github.com/llmq/llmq/internal/tenant"
)

// TestSubmit_OneTenantsKeyedFloodLeavesRoomForOthers: a submit with an Idempotency-Key holds a
// Postgres connection of its own for its transaction. Tenant a's flood of them, each held up in
// Postgres (here: behind a claim of their key not yet committed, as a client resending under one
// key meets), took every connection of the pool, and tenant b's submit waited behind them until
// its bound: 503 overloaded, for a's doing. Now a holds at most its share of the pool (half, by
// default), its excess is a 429 of its own (too_many_submits, Retry-After, counted and logged
// under its name) and b's submit is served.
func TestSubmit_OneTenantsKeyedFloodLeavesRoomForOthers(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	var logs logtest.Buffer
	dbURL := pgtest.URL(t)
	// The bound leaves a loaded machine (-race) time to open a pool connection for a submit with
	// a place: at 300 ms one was answered 503 overloaded instead of waiting for the claim.
	b := setup(t, setupOpts{dbURL: dbURL + "&pool_max_conns=4", noListener: true,
		storeWait: 2 * time.Second, tenantTTL: time.Hour, registry: reg,
		logger: slog.New(slog.NewTextHandler(&logs, nil))})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	_, tokenA, err := b.tenants.Create(ctx, "a", nil)
	require.NoError(t, err)
	_, tokenB, err := b.tenants.Create(ctx, "b", nil)
	require.NoError(t, err)
	// Both tokens' lookups cached (a poll of a job that is not there), so that the flood's
	// requests need Postgres for their submits only.
	for _, tok := range []string{tokenA, tokenB} {
		require.Equal(t, http.StatusNotFound, b.do(t, http.MethodGet, "/v1/jobs/"+uuid.NewString(), "",
			map[string]string{"Authorization": "Bearer " + tok}).status)
	}

	// A transaction outside the pool claims a's key and keeps the claim uncommitted: every
	// submit of a under that key waits for it in Postgres, holding its connection.
	body := `{"request":{"model":"m"}}`
	fp, err := idem.Fingerprint([]byte(body))
	require.NoError(t, err)
	conn, err := pgx.Connect(ctx, dbURL)
	require.NoError(t, err)
	defer conn.Close(context.Background())
	var wg sync.WaitGroup
	defer wg.Wait() // after the rollback, which ends the submits still waiting
	tx, err := conn.Begin(ctx)
	require.NoError(t, err)
	rollback := sync.OnceFunc(func() { require.NoError(t, tx.Rollback(ctx)) })
	defer rollback()
	_, err = idem.ClaimKey(ctx, tx, "a", "flood", fp, uuid.NewString())
	require.NoError(t, err)

	// Another connection watches them (one in a transaction sees one snapshot of the activity).
	watch, err := pgx.Connect(ctx, dbURL)
	require.NoError(t, err)
	defer watch.Close(context.Background())

	const flood = 4 // the pool's size
	answers := make(chan submitAnswer, flood)
	for range flood {
		wg.Go(func() { answers <- submitWith(ctx, b.url, body, "flood", tokenA) })
	}
	// Every submit of a's is either waiting for the claim in Postgres or answered.
	answered := pgtest.LockWaitingOrAnswered(ctx, t, watch, answers, flood, "a's submits")

	// b is served while a's flood holds on.
	got := submitWith(ctx, b.url, body, "b-1", tokenB)
	require.Equal(t, "202 ", got.code, "tenant b's submit while tenant a floods: %s", got.body)
	require.Contains(t, got.body, `"status":"queued"`)

	// a's excess was refused as a's own: 429, named, with Retry-After, counted under its name.
	require.Len(t, answered, flood/2)
	for _, a := range answered {
		require.Equal(t, "429 too_many_submits", a.code, a.body)
		require.Equal(t, "1", a.retryAfter)
		require.Contains(t, a.body, `tenant \"a\"`)
	}
	require.EqualValues(t, flood/2, testutil.ToFloat64(gatheredCounter(t, reg, "llmq_http_tenant_refusals_total", "tenant", "a")))
	require.Equal(t, 1, logs.Count("tenant over its share; refused"), logs.String())
	require.Contains(t, logs.String(), "tenant=a anonymous=false type=too_many_submits")

	// The claim gone, a's submits under way end as one job: one created, the other its replay.
	rollback()
	var codes []string
	for range flood - len(answered) {
		select {
		case a := <-answers:
			codes = append(codes, a.code)
		case <-ctx.Done():
			t.Fatal("a's submits under way did not end")
		}
	}
	require.ElementsMatch(t, []string{"202 ", "200 "}, codes)
	var perTenant []string
	rows, err := b.pool.Query(ctx, `SELECT tenant || ':' || status FROM jobs ORDER BY tenant`)
	require.NoError(t, err)
	perTenant, err = pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Equal(t, []string{"a:queued", "b:queued"}, perTenant)
}

// submitAnswer is a submit's status and error type ("202 " for none), its Retry-After and body.
type submitAnswer struct {
	code, retryAfter, body string
}

// submitWith posts body under the Idempotency-Key key as the token's tenant (anonymous without
// one) and returns its answer, or what went wrong as its code.
func submitWith(ctx context.Context, base, body, key, token string) submitAnswer {
	return sendAs(ctx, http.MethodPost, base+"/v1/jobs", strings.NewReader(body), key, token)
}

// sendAs sends method url with body (none when nil), under the Idempotency-Key key (none when
// empty), as the token's tenant (anonymous without one), within 10 s, and returns its answer,
// or what went wrong as its code. It is safe to call from any goroutine.
func sendAs(ctx context.Context, method, url string, body io.Reader, key, token string) submitAnswer {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, url, body)
	if err != nil {
		return submitAnswer{code: err.Error()}
	}
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return submitAnswer{code: err.Error()}
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		return submitAnswer{code: err.Error()}
	}
	typ := ""
	if i := strings.Index(string(raw), `"type":"`); i >= 0 {
		typ, _, _ = strings.Cut(string(raw[i+len(`"type":"`):]), `"`)
	}
	return submitAnswer{code: fmt.Sprintf("%d %s", resp.StatusCode, typ), retryAfter: resp.Header.Get("Retry-After"), body: string(raw)}
}

// TestServer_TenantRefusalsCountedByAuthenticatedTenant: a 429 for a tenant's own excess is
// counted in llmq_http_tenant_refusals_total by type, under the tenant's name when the request
// authenticated as it, and under "" when it came without a token (the anonymous tenant "default"):
// the label holds no value a client chose. Each tenant's and type's first refusal is logged.
func TestServer_TenantRefusalsCountedByAuthenticatedTenant(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	var logs logtest.Buffer
	rate, err := tenant.NewRateLimiter(redistest.Client(t), &tenant.RateLimiterConfig{
		Rate: tenant.Rate{PerSecond: 0.01, Burst: 1}, Prefix: redistest.Prefix(t)})
	require.NoError(t, err)
	b := setup(t, setupOpts{submitRate: rate, registry: reg, noListener: true,
		logger: slog.New(slog.NewTextHandler(&logs, nil))})
	acme := b.newTenant(t, "acme")
	for _, h := range []map[string]string{nil, acme} {
		require.Equal(t, http.StatusAccepted, b.do(t, http.MethodPost, "/v1/jobs", minimalSubmit, h).status)
		for range 2 {
			requireError(t, b.do(t, http.MethodPost, "/v1/jobs", minimalSubmit, h), http.StatusTooManyRequests, "rate_limited")
		}
	}
	mfs, err := reg.Gather()
	require.NoError(t, err)
	counted := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != "llmq_http_tenant_refusals_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, lp := range m.GetLabel() {
				labels[lp.GetName()] = lp.GetValue()
			}
			counted[labels["tenant"]+"/"+labels["type"]] = m.GetCounter().GetValue()
		}
	}
	require.Equal(t, map[string]float64{"/rate_limited": 2, "acme/rate_limited": 2}, counted)
	require.Equal(t, 1, logs.Count("tenant=default anonymous=true type=rate_limited"), logs.String())
	require.Equal(t, 1, logs.Count("tenant=acme anonymous=false type=rate_limited"), logs.String())
}

// TestSubmit_KeyedPlaceFreedWhenPostgresIsDone: a keyed submit's place (MaxKeyedSubmitsPerTenant)
// guards the pool connection its transaction holds, and ends with it. It was held to the end of
// the handler: through the enqueue after the commit too, which waits up to dispatch.RedisWait
// (1 s) for a stalled Redis, with no pool connection held. With Redis stalled, every tenant's
// keyed submits went at most a share per second per replica (8 by default), and the rest were
// refused 429 too_many_submits: the tenant blamed for the service's stall. Here, with a share of
// one, a keyed submit whose job is committed and whose enqueue waits for Redis leaves the
// tenant's next keyed submit its place.
func TestSubmit_KeyedPlaceFreedWhenPostgresIsDone(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	opt, unstall := stalledOpt(t)
	rdb := dispatch.NewRedisClient(opt)
	t.Cleanup(func() { _ = rdb.Close() })
	t.Cleanup(unstall) // first: the enqueues left in the background fail
	aclient := asynq.NewClientFromRedisClient(dispatch.AutoPipelined(rdb, enqueueBatches))
	reg := prometheus.NewRegistry()
	srv := New(Config{Store: b.store, Pool: b.pool, AllowAnonymous: true,
		Submit:   SubmitConfig{Credentials: []string{"default"}},
		Enqueuer: dispatch.NewEnqueuer(aclient, b.queue, dispatch.Deferred(rdb)),
		Metrics:  NewMetrics(reg), Gatherer: reg,
		// The second submit waits for a place at most half of the first's wait for Redis.
		MaxKeyedSubmitsPerTenant: 1, StoreWait: dispatch.RedisWait / 2})

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	keyed := func(key string) *http.Request {
		req := httptest.NewRequestWithContext(ctx, http.MethodPost, "/v1/jobs", strings.NewReader(minimalSubmit))
		req.Header.Set("Idempotency-Key", key)
		return req
	}
	first := make(chan *httptest.ResponseRecorder, 1)
	go func() { first <- serveWithin(t, srv, keyed("first")) }()
	// The first job committed: its submit waits for the stalled Redis (up to RedisWait).
	for committed := 0; committed == 0; {
		require.NoError(t, b.pool.QueryRow(ctx, `SELECT count(*) FROM jobs`).Scan(&committed))
		select {
		case rec := <-first:
			t.Fatalf("the first submit was answered before its enqueue waited: %d %s", rec.Code, rec.Body.String())
		case <-ctx.Done():
			t.Fatal("the first submit's job was never committed")
		case <-time.After(5 * time.Millisecond):
		}
	}
	rec := serveWithin(t, srv, keyed("second"))
	require.Equal(t, http.StatusAccepted, rec.Code, "the tenant's next keyed submit while the first waits for Redis: %s", rec.Body.String())
	select {
	case rec := <-first:
		require.Equal(t, http.StatusAccepted, rec.Code, rec.Body.String())
	case <-ctx.Done():
		t.Fatal("the first submit was not answered")
	}
	var n int
	require.NoError(t, b.pool.QueryRow(ctx, `SELECT count(*) FROM jobs WHERE status = 'queued'`).Scan(&n))
	require.Equal(t, 2, n)
	require.Zero(t, testutil.CollectAndCount(reg, "llmq_http_tenant_refusals_total"))
}
