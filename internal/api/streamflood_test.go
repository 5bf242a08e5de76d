package api

import (
	"bufio"
	"context"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/pgtest"
	"github.com/llmq/llmq/internal/secrettoken"
	"github.com/llmq/llmq/internal/tenant"
)

// TestEvents_UnknownTokenFloodTakesNoStreamPlace: an event stream took one of the replica's
// stream places (api.max_streams) before its caller was authenticated, and the lookup of a
// made-up token (its place among the new tokens' lookups, then Postgres) has no bound on a
// stream: a client without any token of ours, sending made-up ones while Postgres was slow (here:
// behind a lock of the tenants table), held every stream place for as long as its lookups waited,
// and tenant b's stream of its own job was refused 503 overloaded. Now the caller is
// authenticated first: the flood holds no stream place, b's stream is served, and the flood's
// lookups, once Postgres answers, are 401s, never counted as streams refused.
func TestEvents_UnknownTokenFloodTakesNoStreamPlace(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.URL(t)
	reg := prometheus.NewRegistry()
	// A pool of 8: the new tokens' lookups hold 2 of it, so that the whole flood waits in
	// Postgres, where the test sees it.
	b := setup(t, setupOpts{dbURL: dbURL + "&pool_max_conns=8", tenantTTL: time.Hour, registry: reg,
		maxServerStreams: 2})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	_, tokenB, err := b.tenants.Create(ctx, "b", nil)
	require.NoError(t, err)
	job := b.create(t, "b")
	// b's token is cached: its stream needs Postgres for the job only.
	require.Equal(t, "404 not_found", requestWith(ctx, b.url, http.MethodGet, "/v1/jobs/"+uuid.NewString(), tokenB).code)

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

	const flood = 2 // the replica's stream places, and the new tokens' lookups' places
	answers := make(chan submitAnswer, flood)
	for range flood {
		token, err := secrettoken.New(nil, tenant.BearerTokenPrefix)
		require.NoError(t, err)
		wg.Go(func() { answers <- requestWith(ctx, b.url, http.MethodGet, "/v1/jobs/"+job.ID+"/events", token) })
	}
	answered := pgtest.LockWaitingOrAnswered(ctx, t, watch, answers, flood, "the flood's lookups")
	require.Empty(t, answered, "the flood's lookups wait in Postgres")

	// b's stream is served while the flood waits.
	s := openStreamAs(ctx, t, b.url, job.ID, tokenB)
	require.Equal(t, "queued", s.nextEvent(t).event)
	require.Equal(t, 1.0, openStreams(reg), "b's stream only holds a place")

	rollback()
	for range flood {
		select {
		case a := <-answers:
			require.Equal(t, "401 unauthorized", a.code, a.body)
		case <-ctx.Done():
			t.Fatal("the flood's lookups did not end")
		}
	}
	require.Equal(t, 0.0, testutil.ToFloat64(gatheredCounter(t, reg, "llmq_event_streams_rejected_total", "reason", "server")))
}

// openStreamAs opens the job's event stream as the token's tenant, within ctx, failing the test
// unless it is served.
func openStreamAs(ctx context.Context, t *testing.T, base, id, token string) *stream {
	t.Helper()
	ctx, cancel := context.WithCancel(ctx)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/v1/jobs/"+id+"/events", nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		cancel()
		require.NoError(t, err)
	}
	s := &stream{resp: resp, lines: bufio.NewScanner(resp.Body), cancel: cancel}
	t.Cleanup(s.close)
	if resp.StatusCode != http.StatusOK {
		raw := make([]byte, 512)
		n, _ := resp.Body.Read(raw)
		t.Fatalf("stream answered %d: %s", resp.StatusCode, raw[:n])
	}
	return s
}

// TestEvents_UnknownTokenLookupIsBounded: a stream's lookup of its bearer token had no bound
// (a poll's and a submit's wait StoreWait for a connection, or a place among the lookups of new
// tokens, and StoreTimeout in all): a made-up token's stream held its HTTP connection, and one
// of api.max_connections, for as long as Postgres took to answer (here: behind a lock of the
// tenants table), and the one behind it waited for a lookup's place as long. Now the first is
// answered 503 unavailable at StoreTimeout and the second 503 overloaded at StoreWait, as a
// poll's would be.
func TestEvents_UnknownTokenLookupIsBounded(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.URL(t)
	// A pool of 4: the lookups of new tokens hold one connection of it. The lookups' deadlines
	// are read: a silenced statement is answered within 30 s by the default StoreTimeout (10 s)
	// too, so the deadline tells the configured bound from it.
	lookups := &queryCounter{spanOf: "FROM tenants WHERE token_sha256 = $1", spans: make(chan time.Duration, 4)}
	b := setup(t, setupOpts{dbURL: dbURL + "&pool_max_conns=4", tenantTTL: time.Hour,
		storeWait: 200 * time.Millisecond, storeTimeout: time.Second, queries: lookups})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	job := b.create(t, "")

	conn, err := pgx.Connect(ctx, dbURL)
	require.NoError(t, err)
	defer conn.Close(context.Background())
	var wg sync.WaitGroup
	defer wg.Wait() // after the rollback, which ends any lookup still waiting
	tx, err := conn.Begin(ctx)
	require.NoError(t, err)
	rollback := sync.OnceFunc(func() { require.NoError(t, tx.Rollback(ctx)) })
	defer rollback()
	_, err = tx.Exec(ctx, `LOCK TABLE tenants IN ACCESS EXCLUSIVE MODE`)
	require.NoError(t, err)
	watch, err := pgx.Connect(ctx, dbURL)
	require.NoError(t, err)
	defer watch.Close(context.Background())

	stream := func(answers chan<- submitAnswer) {
		token, err := secrettoken.New(nil, tenant.BearerTokenPrefix)
		require.NoError(t, err)
		wg.Go(func() { answers <- requestWith(ctx, b.url, http.MethodGet, "/v1/jobs/"+job.ID+"/events", token) })
	}
	// Within 30 s: StoreTimeout and StoreWait are well under it; unbounded, the lookups wait for
	// the rollback, after it.
	answer := func(answers <-chan submitAnswer, what string) submitAnswer {
		t.Helper()
		select {
		case a := <-answers:
			return a
		case <-time.After(30 * time.Second):
			t.Fatalf("%s: no answer within 30 s while the tenants table is locked", what)
		}
		return submitAnswer{}
	}
	inPostgres := make(chan submitAnswer, 1)
	stream(inPostgres)
	// The first lookup waits in Postgres, holding the lookups' place (or is answered already),
	// under the configured StoreTimeout (1 s), not the default (10 s).
	answered := pgtest.LockWaitingOrAnswered(ctx, t, watch, inPostgres, 1, "the first lookup")
	select {
	case span := <-lookups.spans:
		require.Positive(t, span, "the lookup has a deadline")
		require.LessOrEqual(t, span, time.Second, "a lookup's deadline beyond the configured StoreTimeout")
	case <-ctx.Done():
		t.Fatal("the lookup was not sent")
	}
	forPlace := make(chan submitAnswer, 1)
	stream(forPlace)
	a := answer(forPlace, "the lookup waiting for a place")
	require.Equal(t, "503 overloaded", a.code, a.body)
	require.Equal(t, "1", a.retryAfter)
	if len(answered) == 0 {
		answered = append(answered, answer(inPostgres, "the lookup waiting in Postgres"))
	}
	require.Equal(t, "503 unavailable", answered[0].code, answered[0].body)
	require.Equal(t, "5", answered[0].retryAfter)
	rollback()
}
