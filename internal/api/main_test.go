package api

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/llmq/llmq/internal/deltastream"
	"github.com/llmq/llmq/internal/dispatch"
	"github.com/llmq/llmq/internal/httpserve"
	"github.com/llmq/llmq/internal/jobs"
	"github.com/llmq/llmq/internal/openapitest"
	"github.com/llmq/llmq/internal/pgtest"
	"github.com/llmq/llmq/internal/pgwait"
	"github.com/llmq/llmq/internal/redistest"
	"github.com/llmq/llmq/internal/tenant"
	"github.com/llmq/llmq/internal/tokens"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// pgxpool's background health check and net/http keep-alives end after the test's Close.
		goleak.IgnoreTopFunction("internal/poll.runtime_pollWait"),
		goleak.IgnoreTopFunction("net/http.(*persistConn).writeLoop"),
	)
}

// testBundle is one API replica on a test database, with its listener running.
type testBundle struct {
	dbURL     string
	pool      *pgxpool.Pool
	store     *jobs.Store
	srv       *Server
	url       string
	listener  *jobs.Listener
	inspector *asynq.Inspector
	queue     string
	tenants   *tenant.Store
	deltas    *deltastream.Buffer // with setupOpts.deltas
	// handoff is Config.Handoff (with setupOpts.handoff); stopHandoff ends its Run.
	handoff     *dispatch.Handoff
	stopHandoff func()
}

type setupOpts struct {
	dbURL      string        // default: a fresh database
	keepAlive  time.Duration // default: the server's 15s, so a test passing fast proves NOTIFY
	noListener bool
	maxBody    int64
	// maxBodyInFlight is Config.MaxBodyBytesInFlight; default the server's.
	maxBodyInFlight int64
	wrap            func(*Server) http.Handler // default: the server itself
	noAnonymous     bool                       // api.allow_anonymous off
	credentials     []string                   // configured credentials; default ["default"]
	kinds           map[string]string          // the credentials' provider kinds; default not checked
	tokenLimits     map[string]tokens.Limits   // the credentials' configured token limits; default none
	submitRate      *tenant.RateLimiter        // the tenants' submit rate; default unlimited
	logger          *slog.Logger               // default: discard
	signer          *StreamSigner              // signs events_url; default none
	// server, when set, serves through httpserve.NewServer with these timeouts (default: a
	// plain httptest server).
	server *httpserve.Config
	// listener, when set, wraps the test server's listener.
	listener          func(net.Listener) net.Listener
	eventWriteTimeout time.Duration
	// writeNow is Config.writeNow, the clock of the streams' write deadlines; default time.Now.
	writeNow func() time.Time
	// retryRand is Config.retryRand, the jitter of a refused EventSource's retry; default random.
	retryRand  func() float64
	maxStreams int
	now        func() time.Time
	registry   *prometheus.Registry // the API's metrics; default none
	// batchWindows are the credentials with a batch lane, with their window; default none.
	batchWindows map[string]time.Duration
	deltas       bool // follow streaming jobs' delta buffers (testBundle.deltas)
	// redisHook, when set, is added to the API's Redis client (the delta buffers' too).
	redisHook redis.Hook
	// tenantTTL is how long a token's lookup is cached (the delay of a revocation); default 2s.
	tenantTTL time.Duration
	// handoff, when set, is the processor of a Handoff (Config.Handoff) the bundle runs on its
	// queue (testBundle.handoff, testBundle.stopHandoff); default none.
	handoff dispatch.FreshProcessor
	// storeWait is Config.StoreWait; default the server's.
	storeWait time.Duration
	// maxKeyedSubmits is Config.MaxKeyedSubmitsPerTenant; default the server's (half the pool).
	maxKeyedSubmits int
	// storeTimeout is Config.StoreTimeout; default the server's.
	storeTimeout time.Duration
	// keepAliveTicks is Config.keepAliveTicks: the test sends each stream's keep-alive tick;
	// default a ticker of keepAlive.
	keepAliveTicks chan time.Time
	// keepAliveRand is Config.keepAliveRand, the draw of a stream's first keep-alive; default
	// random.
	keepAliveRand func() float64
	// newTicker is Config.newTicker, the streams' keep-alive tickers; default time's.
	newTicker func(d time.Duration) (<-chan time.Time, ticker)
	// queries, when set, counts the statements of the server's pool on a job (queryCounter).
	queries *queryCounter
	// maxServerStreams is Config.MaxStreams; default the server's.
	maxServerStreams int
}

// queryCounter is a pool's tracer (pgwait.Tracer's, and) counting the statements that read or
// watch jobs: those reading the jobs or job_events table by a job's ID (or several: the
// Listener's catch-up, whose connection copies the pool's config).
type queryCounter struct {
	pgwait.Tracer
	n atomic.Int64
	// spanOf, when set, is a part of the statements whose deadlines spans receives: how far
	// ahead of the statement's start its context's deadline was (-1: none). A deadline is set
	// before the statement starts, so a loaded machine only shortens the span.
	spanOf string
	spans  chan time.Duration
	// sqls, when set, receives each statement counted, while it has room (the test reads them).
	sqls chan string
	// hold, when set, is called with each statement sent alone before it is sent: it may hold it
	// (and its connection) until the test lets it go.
	hold func(sql string)
}

// TraceQueryStart counts d when it reads or watches a job, and sends the span of its deadline
// when it is one of spanOf.
func (c *queryCounter) TraceQueryStart(ctx context.Context, conn *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if c.hold != nil {
		c.hold(d.SQL)
	}
	c.count(d.SQL)
	if c.spanOf != "" && strings.Contains(d.SQL, c.spanOf) {
		span := time.Duration(-1)
		if deadline, ok := ctx.Deadline(); ok {
			span = time.Until(deadline)
		}
		select {
		case c.spans <- span:
		default: // the test reads the first ones only
		}
	}
	return c.Tracer.TraceQueryStart(ctx, conn, d)
}

// count counts sql when it reads or watches a job.
func (c *queryCounter) count(sql string) {
	if strings.Contains(sql, "FROM jobs WHERE id = $1") || strings.Contains(sql, "FROM jobs WHERE id = ANY($1") ||
		strings.Contains(sql, "FROM job_events WHERE job_id = $1") {
		c.n.Add(1)
		select {
		case c.sqls <- sql: // a nil channel never has room
		default:
		}
	}
}

// TraceBatchStart does nothing: the store's batcher sends its statements (a job's read among
// them) in pipelines, counted by TraceBatchQuery.
func (c *queryCounter) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	return ctx
}

// TraceBatchQuery counts a pipeline's statement as TraceQueryStart counts one sent alone.
func (c *queryCounter) TraceBatchQuery(_ context.Context, _ *pgx.Conn, d pgx.TraceBatchQueryData) {
	c.count(d.SQL)
}

// TraceBatchEnd does nothing.
func (c *queryCounter) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

// tickedStream sets up a server with o, whose keep-alive ticks the test sends (the returned
// channel) and whose statements on jobs it counts (the returned counter), creates a job and
// opens its stream, read past its "queued" event.
func tickedStream(t *testing.T, o setupOpts) (*testBundle, *jobs.Job, *stream, chan time.Time, *queryCounter) {
	t.Helper()
	o.keepAliveTicks, o.queries = make(chan time.Time), &queryCounter{}
	b := setup(t, o)
	job := b.create(t, "")
	s := openStream(t, b.url, job.ID, "")
	require.Equal(t, "queued", s.nextEvent(t).event)
	return b, job, s, o.keepAliveTicks, o.queries
}

// keepAlive sends s one keep-alive tick and reads the keep-alive it writes: its statements are
// done by then (it is flushed after them).
func keepAlive(t *testing.T, ticks chan<- time.Time, s *stream) {
	t.Helper()
	tick(t, ticks)
	f, ok := s.next(t)
	require.True(t, ok)
	require.Equal(t, sseFrame{comment: "keep-alive"}, f)
}

// tick sends one keep-alive tick to a stream waiting for it (setupOpts.keepAliveTicks).
func tick(t *testing.T, ticks chan<- time.Time) {
	t.Helper()
	select {
	case ticks <- time.Now():
	case <-time.After(30 * time.Second):
		t.Fatal("no stream took the keep-alive tick within 30s")
	}
}

func setup(t testing.TB, o setupOpts) *testBundle {
	t.Helper()
	if o.dbURL == "" {
		o.dbURL = pgtest.URL(t)
	}
	ctx := context.Background()
	pcfg, err := pgxpool.ParseConfig(o.dbURL)
	require.NoError(t, err)
	pcfg.ConnConfig.Tracer = pgwait.Tracer{} // as migrations.Open does
	if o.queries != nil {
		pcfg.ConnConfig.Tracer = o.queries
	}
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	redistest.Client(t) // fails the test when Redis is down
	redisOpt, err := dispatch.RedisConnOpt(redistest.URL())
	require.NoError(t, err)
	rdb := dispatch.NewRedisClient(redisOpt)
	if o.redisHook != nil {
		rdb.AddHook(o.redisHook)
	}
	aclient := asynq.NewClient(redisOpt)
	insp := asynq.NewInspector(redisOpt)
	queue := redistest.Queue(t, redistest.URL())
	t.Cleanup(func() {
		require.NoError(t, insp.Close())
		require.NoError(t, aclient.Close())
		require.NoError(t, rdb.Close())
	})
	store := jobs.NewStore(pool, nil)
	enq := dispatch.NewEnqueuer(aclient, queue, nil)
	b := &testBundle{dbURL: o.dbURL, pool: pool, store: store, inspector: insp, queue: queue}
	if o.credentials == nil {
		o.credentials = []string{"default"}
	}
	if o.logger == nil {
		o.logger = slog.New(slog.DiscardHandler)
	}
	b.tenants = tenant.NewStore(pool, nil)
	cfg := Config{
		Store: store, Pool: pool, Redis: rdb, AllowAnonymous: !o.noAnonymous, MaxBodyBytes: o.maxBody, MaxBodyBytesInFlight: o.maxBodyInFlight,
		Submit: SubmitConfig{Credentials: o.credentials, BatchWindows: o.batchWindows, Kinds: o.kinds, TokenLimits: o.tokenLimits}, Enqueuer: enq,
		Tasks: dispatch.NewTasks(insp, enq), KeepAlive: o.keepAlive, Logger: o.logger,
		Tenants: tenant.NewAuthenticator(b.tenants, &tenant.AuthenticatorConfig{TTL: o.tenantTTL}), SubmitRate: o.submitRate,
		StreamSigner:      o.signer,
		EventWriteTimeout: o.eventWriteTimeout, MaxStreamsPerTenant: o.maxStreams, MaxStreams: o.maxServerStreams, Now: o.now,
		StoreWait: o.storeWait, StoreTimeout: o.storeTimeout, MaxKeyedSubmitsPerTenant: o.maxKeyedSubmits, writeNow: o.writeNow,
		keepAliveTicks: o.keepAliveTicks, retryRand: o.retryRand, keepAliveRand: o.keepAliveRand, newTicker: o.newTicker,
	}
	if o.handoff != nil {
		hcfg := dispatch.HandoffConfig{Processor: o.handoff, Enqueuer: enq, Slots: 16}
		if o.registry != nil {
			hcfg.Metrics = dispatch.NewMetrics(o.registry) // llmq_worker_handoffs_total, as in llmq serve
		}
		b.handoff = dispatch.NewHandoff(hcfg)
		b.stopHandoff = runHandoff(t, b.handoff)
		cfg.Handoff = b.handoff
	}
	if o.registry != nil {
		cfg.Metrics, cfg.Gatherer = NewMetrics(o.registry), o.registry
	}
	if o.deltas {
		b.deltas = deltastream.New(deltastream.Config{Redis: rdb, Prefix: redistest.Prefix(t)})
		hub := b.deltas.NewHub()
		t.Cleanup(func() { require.NoError(t, hub.Close()) })
		cfg.Deltas, cfg.DeltaHub = b.deltas, hub
	}
	if !o.noListener {
		b.listener = jobs.NewListener(jobs.ListenerConfig{ConnConfig: pool.Config().ConnConfig.Copy(),
			ChannelFuncs: cfg.Metrics.listenerFuncs()})
		cfg.Listener = b.listener
		lctx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		// Listening before the test goes on: its first catch-up signals every subscriber.
		ready, unsubscribe := b.listener.Subscribe("ready")
		go func() { done <- b.listener.Run(lctx) }()
		t.Cleanup(func() {
			cancel()
			require.NoError(t, <-done)
		})
		select {
		case <-ready:
		case <-time.After(30 * time.Second):
			t.Fatal("the Listener did not listen within 30s")
		}
		unsubscribe()
	}
	b.srv = New(cfg)
	var h http.Handler = b.srv
	if o.wrap != nil {
		h = o.wrap(b.srv)
	}
	// Every answer of every test must be one that api/openapi.yaml describes.
	vh := openapitest.Handler(t, h)
	hs := httptest.NewUnstartedServer(vh)
	if o.server != nil {
		hs.Config = httpserve.NewServer(vh, *o.server)
	}
	if o.listener != nil {
		hs.Listener = o.listener(hs.Listener)
	}
	hs.Start()
	t.Cleanup(hs.Close)
	t.Cleanup(b.srv.Shutdown) // runs first: ends any stream a failed test left open
	b.url = hs.URL
	return b
}

// create stores a job of tenant "default" (or the given one).
func (b *testBundle) create(t testing.TB, tenant string) *jobs.Job {
	t.Helper()
	if tenant == "" {
		tenant = "default"
	}
	job, _, err := b.store.Create(context.Background(), jobs.CreateParams{
		Tenant: tenant, Credential: "default", Fingerprint: "fp",
		Request: json.RawMessage(`{"model":"m"}`), MaxAttempts: 5, Timeout: time.Minute,
	})
	require.NoError(t, err)
	return job
}

// attempt moves a job through one attempt to o, as the worker does.
func (b *testBundle) attempt(t *testing.T, id string, o jobs.Outcome) {
	t.Helper()
	ctx := context.Background()
	job, err := b.store.BeginAttempt(ctx, id)
	require.NoError(t, err)
	if o.Status == jobs.StatusRetrying {
		o.LastError = &jobs.LastError{Class: "retryable", Status: 503, Message: "overloaded"}
	}
	applied, err := b.store.Finish(ctx, id, &jobs.Attempt{
		Number: job.Attempts, Credential: "default", StartedAt: time.Now(), Latency: time.Millisecond, Class: "ok",
	}, o)
	require.NoError(t, err)
	require.True(t, applied)
}

// succeed runs the job's two failing attempts and the successful third (7 events in all).
func (b *testBundle) failTwiceThenSucceed(t *testing.T, id string) {
	t.Helper()
	b.attempt(t, id, jobs.Outcome{Status: jobs.StatusRetrying})
	b.attempt(t, id, jobs.Outcome{Status: jobs.StatusRetrying})
	b.attempt(t, id, jobs.Outcome{Status: jobs.StatusSucceeded, Result: json.RawMessage(`{"answer":42}`)})
}

type response struct {
	status int
	header http.Header
	body   map[string]any
}

func (b *testBundle) do(t *testing.T, method, path, body string, header map[string]string) response {
	t.Helper()
	return do(t, b.url, method, path, body, header)
}

func do(t *testing.T, base, method, path, body string, header map[string]string) response {
	t.Helper()
	// A deadline: an answer expected whole that turns out to be an endless stream fails the test.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, base+path, strings.NewReader(body))
	require.NoError(t, err)
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	out := response{status: resp.StatusCode, header: resp.Header}
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json") && len(raw) > 0 {
		require.NoError(t, json.Unmarshal(raw, &out.body), "body: %s", raw)
	}
	return out
}

// sseFrame is one frame of an event stream: an event, or a comment.
type sseFrame struct {
	event, id, data, comment string
}

// stream is an open event stream.
type stream struct {
	resp   *http.Response
	lines  *bufio.Scanner
	cancel context.CancelFunc
}

// openStream opens GET /v1/jobs/{id}/events (with Last-Event-ID when lastID is not empty) and
// requires 200. Reads fail after 10s: well under the 15s default keep-alive, so a stream that only
// advances through its keep-alive re-read fails a test that expects notifications.
func openStream(t *testing.T, base, id, lastID string) *stream {
	t.Helper()
	return openStreamPath(t, base, "/v1/jobs/"+id+"/events", lastID)
}

// openStreamPath is openStream of a path (a signed events_url, say).
func openStreamPath(t *testing.T, base, path, lastID string) *stream {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+path, nil)
	require.NoError(t, err)
	if lastID != "" {
		req.Header.Set("Last-Event-ID", lastID)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Equal(t, "text/event-stream", resp.Header.Get("Content-Type"))
	s := &stream{resp: resp, lines: bufio.NewScanner(resp.Body), cancel: cancel}
	t.Cleanup(s.close)
	return s
}

func (s *stream) close() {
	s.cancel()
	_ = s.resp.Body.Close()
}

// next returns the next frame, or ok=false at the end of the stream.
func (s *stream) next(t *testing.T) (f sseFrame, ok bool) {
	t.Helper()
	f, ok, err := readFrame(s.lines)
	require.NoError(t, err)
	return f, ok
}

// readFrame reads the next frame of an event stream, or ok=false at its end. It fails on a read
// error (a timeout, say), a line that is no SSE field and a stream that ends inside a frame.
func readFrame(lines *bufio.Scanner) (f sseFrame, ok bool, err error) {
	started := false
	for lines.Scan() {
		line := lines.Text()
		if line == "" {
			if started {
				return f, true, nil
			}
			continue
		}
		started = true
		k, v, _ := strings.Cut(line, ":")
		v = strings.TrimPrefix(v, " ")
		switch k {
		case "":
			f.comment = v
		case "event":
			f.event = v
		case "id":
			f.id = v
		case "data":
			f.data = v
		default:
			return f, false, fmt.Errorf("unexpected line %q", line)
		}
	}
	if err := lines.Err(); err != nil {
		return f, false, fmt.Errorf("stream read failed (timed out?): %w", err)
	}
	if started {
		return f, false, errors.New("stream ended inside a frame")
	}
	return f, false, nil
}

// nextEvent skips comments and returns the next event; it fails at the end of the stream.
func (s *stream) nextEvent(t *testing.T) sseFrame {
	t.Helper()
	for {
		f, ok := s.next(t)
		require.True(t, ok, "stream ended early")
		if f.comment == "" {
			return f
		}
	}
}

// rest reads events until the stream ends.
func (s *stream) rest(t *testing.T) []sseFrame {
	t.Helper()
	var out []sseFrame
	for {
		f, ok := s.next(t)
		if !ok {
			return out
		}
		if f.comment == "" {
			out = append(out, f)
		}
	}
}

// names returns "event/id" of each frame.
func names(fs []sseFrame) []string {
	out := make([]string, len(fs))
	for i, f := range fs {
		out[i] = f.event + "/" + f.id
	}
	return out
}

func jobData(t *testing.T, f sseFrame) map[string]any {
	t.Helper()
	var m map[string]any
	require.NoError(t, json.Unmarshal([]byte(f.data), &m), "data %q", f.data)
	return m
}
