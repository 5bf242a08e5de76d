package batchlane_test

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/batchlane"
	"github.com/llmq/llmq/internal/clocktest"
	"github.com/llmq/llmq/internal/config"
	"github.com/llmq/llmq/internal/jobs"
	"github.com/llmq/llmq/internal/llmsim"
	"github.com/llmq/llmq/internal/pgtest"
)

// testBundle is a batch lane on a fresh database and a simulator sharing one fake clock, which
// starts at the real time and is moved up to each job's creation when it lags it (catchUp).
type testBundle struct {
	pool     *pgxpool.Pool
	store    *jobs.Store
	sim      *llmsim.Server
	clock    *clocktest.Clock
	provider string
	client   batchlane.Client
	cfg      config.Batch
	metrics  *batchlane.Metrics
	registry *prometheus.Registry
	maxBytes int64

	mu       sync.Mutex
	enqueued []string
}

type setupOpts struct {
	provider string        // anthropic (default) or openai
	delay    time.Duration // the simulator's processing delay; default 1h
	maxReqs  int           // max_requests_per_batch; default 100
	// enqueuedTokens, when set, is the simulator's EnqueuedTokenLimit (OpenAI).
	enqueuedTokens int
	// maxBytes, when set, is the simulator's batch size cap and the lane's (Lane.MaxBytes).
	maxBytes int64
	// front, when set, stands between the client and the simulator (a misbehaving network or
	// provider): it is given the simulator and returns the handler the client talks to.
	front func(sim http.Handler) http.Handler
}

func setup(t *testing.T, o setupOpts) *testBundle {
	t.Helper()
	if o.provider == "" {
		o.provider = "anthropic"
	}
	if o.delay == 0 {
		o.delay = time.Hour
	}
	if o.maxReqs == 0 {
		o.maxReqs = 100
	}
	clock := clocktest.New(time.Now())
	sim := llmsim.New(llmsim.Config{Now: clock.Now, Batch: llmsim.BatchConfig{ProcessingDelay: o.delay, MaxBytes: o.maxBytes,
		EnqueuedTokenLimit: o.enqueuedTokens}})
	var h http.Handler = sim
	if o.front != nil {
		h = o.front(sim)
	}
	ts := httptest.NewServer(h)
	t.Cleanup(ts.Close)
	client, err := batchlane.NewClient(o.provider, ts.URL, "sk-test", ts.Client())
	require.NoError(t, err)
	pool := pgtest.Pool(t)
	reg := prometheus.NewRegistry()
	return &testBundle{pool: pool, registry: reg, maxBytes: o.maxBytes, metrics: batchlane.NewMetrics(reg, []string{"default"}), store: jobs.NewStore(pool, nil), sim: sim, clock: clock, provider: o.provider, client: client,
		cfg: config.Batch{Enabled: true, MaxRequestsPerBatch: o.maxReqs, MaxWaitToFill: time.Minute, PollInterval: 30 * time.Second,
			Window: 24 * time.Hour, OnlineFallback: 10 * time.Minute}}
}

// batcher returns a batcher of the default credential through client (nil: the bundle's).
func (b *testBundle) batcher(client batchlane.Client) *batchlane.Batcher {
	if client == nil {
		client = b.client
	}
	return batchlane.New(batchlane.Config{Pool: b.pool, Now: b.clock.Now, Metrics: b.metrics,
		Lanes:   []batchlane.Lane{{Credential: "default", Client: client, Config: b.cfg, MaxBytes: b.maxBytes}},
		Enqueue: b.enqueue})
}

// enqueue is the batchers' Config.Enqueue: it records the job handed to the online lane.
func (b *testBundle) enqueue(_ context.Context, id string, _ jobs.Priority) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.enqueued = append(b.enqueued, id)
	return nil
}

// online returns the jobs handed to the online lane so far, sorted.
func (b *testBundle) online() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := slices.Clone(b.enqueued)
	slices.Sort(out)
	return out
}

// submit stores a batch-lane job whose user text is text, with a 24h timeout unless given.
func (b *testBundle) submit(t *testing.T, text string, timeout time.Duration, maxAttempts int) *jobs.Job {
	t.Helper()
	if timeout == 0 {
		timeout = 24 * time.Hour
	}
	if maxAttempts == 0 {
		maxAttempts = 3
	}
	// Encoded as a client may send it: <, > and & as they are.
	var body map[string]any
	if b.provider == "openai" {
		body = map[string]any{"model": "gpt-sim", "messages": []any{map[string]string{"role": "user", "content": text}}}
	} else {
		body = map[string]any{"model": "claude-sim", "max_tokens": 64,
			"messages": []any{map[string]string{"role": "user", "content": text}}}
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	require.NoError(t, enc.Encode(body))
	req := bytes.TrimSpace(buf.Bytes())
	job, _, err := b.store.Create(context.Background(), jobs.CreateParams{Tenant: "default", Credential: "default",
		Request: req, MaxAttempts: maxAttempts, Timeout: timeout, Lane: jobs.LaneBatch})
	require.NoError(t, err)
	b.catchUp(job)
	return job
}

// catchUp moves the fake clock to job's creation (Postgres's clock, which also dates its
// deadline) when the clock lags it, as it does by the time a test took to get here: a test's
// moves of the clock then count from its jobs' creation, however slow the machine, not from
// when the clock was made.
func (b *testBundle) catchUp(job *jobs.Job) {
	if job.CreatedAt.After(b.clock.Now()) {
		b.clock.Set(job.CreatedAt)
	}
}

func (b *testBundle) get(t *testing.T, id string) *jobs.Job {
	t.Helper()
	j, err := b.store.Get(context.Background(), id)
	require.NoError(t, err)
	return j
}

// once runs one pass and requires it to succeed.
func once(t *testing.T, bt *batchlane.Batcher) {
	t.Helper()
	require.NoError(t, bt.Once(context.Background()))
}

// batchRefs returns each job's batch_ref (job id → batch row id, "" for none).
func (b *testBundle) batchRefs(t *testing.T) map[string]string {
	t.Helper()
	rows, err := b.pool.Query(context.Background(), `SELECT id::text, coalesce(batch_ref::text, '') FROM jobs`)
	require.NoError(t, err)
	defer rows.Close()
	out := map[string]string{}
	for rows.Next() {
		var id, ref string
		require.NoError(t, rows.Scan(&id, &ref))
		out[id] = ref
	}
	require.NoError(t, rows.Err())
	return out
}

// events returns the job's event types in order.
func (b *testBundle) events(t *testing.T, id string) []string {
	t.Helper()
	rows, err := b.pool.Query(context.Background(), `SELECT type FROM job_events WHERE job_id = $1 ORDER BY seq`, id)
	require.NoError(t, err)
	defer rows.Close()
	var out []string
	for rows.Next() {
		var typ string
		require.NoError(t, rows.Scan(&typ))
		out = append(out, typ)
	}
	require.NoError(t, rows.Err())
	return out
}

// flaky is a Client whose Submit fails: before reaching the provider (lost: false), or after
// the provider accepted the batch (lost: true, the answer never came back), as a crash between
// commit and the recorded send would.
type flaky struct {
	batchlane.Client
	lost bool
}

func (f flaky) Submit(ctx context.Context, ref string, reqs []batchlane.Request, uploaded func(string) error) (string, error) {
	if f.lost {
		if _, err := f.Client.Submit(ctx, ref, reqs, uploaded); err != nil {
			return "", err
		}
	}
	return "", context.DeadlineExceeded
}

// noRecord is a Submit's uploaded of a test that records no file.
func noRecord(string) error { return nil }

// counter is the value of the batch lane's counter name (llmq_batch_<name>_total) for the
// default credential and outcome.
func (b *testBundle) counter(t *testing.T, name, outcome string) float64 {
	t.Helper()
	families, err := b.registry.Gather()
	require.NoError(t, err)
	for _, f := range families {
		if f.GetName() != "llmq_batch_"+name+"_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["credential"] == "default" && labels["outcome"] == outcome {
				return m.GetCounter().GetValue()
			}
		}
	}
	t.Fatalf("no series llmq_batch_%s_total{outcome=%q}", name, outcome)
	return 0
}
