package worker_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/breaker"
	"github.com/llmq/llmq/internal/config"
	"github.com/llmq/llmq/internal/credpause"
	"github.com/llmq/llmq/internal/limiter"
	"github.com/llmq/llmq/internal/pgtest"
	"github.com/llmq/llmq/internal/redisscript"
	"github.com/llmq/llmq/internal/redistest"
	"github.com/llmq/llmq/internal/worker"
)

type testBundle struct {
	cfg    *config.Config
	reg    *prometheus.Registry
	w      *worker.Worker
	prefix string
}

// setup builds a worker with two credentials on a fresh database and its own Redis key space and
// queue, without running it.
func setup(t *testing.T, opts worker.Options) *testBundle {
	t.Helper()
	queue := redistest.Queue(t, redistest.URL()) // removed after the worker below stopped
	cfg, pool := testConfig(t, redistest.URL(), "queue: "+queue+", ")
	b := &testBundle{cfg: cfg, reg: prometheus.NewRegistry(), prefix: redistest.Prefix(t)}
	opts.Registerer, opts.RedisPrefix = b.reg, b.prefix
	var err error
	b.w, err = worker.New(context.Background(), cfg, pool, opts)
	require.NoError(t, err)
	return b
}

// testConfig is a config with two credentials on a fresh database and the Redis at redisURL, with
// worker settings (YAML flow members, each followed by ", ") added, and a pool on its database.
func testConfig(t *testing.T, redisURL, workerSettings string) (*config.Config, *pgxpool.Pool) {
	t.Helper()
	cfg, err := config.Parse(fmt.Appendf(nil, `
database_url: %s
redis_url: %s
worker: { %smetrics_listen: "off" }
credentials:
  - { name: default, provider: anthropic, base_url: "http://127.0.0.1:1", api_key_env: K }
  - { name: backup, provider: anthropic, base_url: "http://127.0.0.1:2", api_key_env: K }
`, pgtest.URL(t), redisURL, workerSettings), func(k string) string {
		if k == "K" {
			return "sk-test"
		}
		return ""
	})
	require.NoError(t, err)
	pool, err := pgxpool.New(context.Background(), cfg.DatabaseURL)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return cfg, pool
}

// run runs the worker until the test ends.
func (b *testBundle) run(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- b.w.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
	})
}

// TestWorker_AlertedSeriesStartAtZero: every series an alerting rule reads exists, at 0, for
// each configured credential (and dead reason) before anything happened, so that the first
// dead letter or refused retry after a start is an increase and its alert fires.
func TestWorker_AlertedSeriesStartAtZero(t *testing.T) {
	t.Parallel()
	b := setup(t, worker.Options{})
	var want strings.Builder
	want.WriteString("# HELP llmq_dead_letters_total Jobs dead-lettered, by reason.\n# TYPE llmq_dead_letters_total counter\n")
	for _, c := range []string{"backup", "default"} {
		for _, r := range []string{"credential_not_configured", "rate_limited_no_retry_after", "retries_exhausted"} {
			fmt.Fprintf(&want, "llmq_dead_letters_total{credential=%q,reason=%q} 0\n", c, r)
		}
	}
	require.NoError(t, testutil.GatherAndCompare(b.reg, strings.NewReader(want.String()), "llmq_dead_letters_total"))
	for _, name := range []string{"llmq_retry_budget_refusals_total", "llmq_limiter_retry_after_pushbacks_total"} {
		n, err := testutil.GatherAndCount(b.reg, name)
		require.NoError(t, err)
		require.Equal(t, 2, n, name)
	}
	for _, series := range []string{`status="dead"`, `status="failed"`, `status="succeeded"`} {
		requireSeries(t, b.reg, "llmq_jobs_finished_total", series, 2)
	}
	requireSeries(t, b.reg, "llmq_attempts_total", `class="rate_limited"`, 2)
	// The leader duties' dates, 0 until a pass succeeds here (the stalled rules read the max).
	requireSeries(t, b.reg, "llmq_maintenance_last_success_timestamp_seconds", `pass="deadline"`, 1)
	requireSeries(t, b.reg, "llmq_sweeper_last_success_timestamp_seconds", "", 1)
	requireSeries(t, b.reg, "llmq_sweeper_pass_failures_total", "", 2)
	// Who leads them: 0 in a worker that does not (no batch lane here: no batch_lane series).
	requireSeries(t, b.reg, "llmq_leader", `duty="maintenance"`, 1)
	requireSeries(t, b.reg, "llmq_leader", `duty="sweeper"`, 1)
	requireSeries(t, b.reg, "llmq_leader", "", 2)
	requireSeries(t, b.reg, "llmq_delivery_errors_total", "", 1)
	requireSeries(t, b.reg, "llmq_delivery_deferrals_total", "", 1)
	requireSeries(t, b.reg, "llmq_alert_webhook_failures_total", "", 1)

	// The pause gauge comes from Redis, read as the worker starts.
	b.run(t)
	require.Eventually(t, func() bool {
		n, err := testutil.GatherAndCount(b.reg, "llmq_limiter_paused")
		return err == nil && n == 2
	}, 30*time.Second, 5*time.Millisecond)
}

func requireSeries(t *testing.T, reg *prometheus.Registry, name, label string, n int) {
	t.Helper()
	got := 0
	for labels, v := range values(t, reg, name) {
		if strings.Contains(labels, label) && v == 0 {
			got++
		}
	}
	require.Equal(t, n, got, "%s{%s} at 0", name, label)
}

// values returns the values of the metric's series by their labels (name="value",...).
func values(t *testing.T, reg *prometheus.Registry, name string) map[string]float64 {
	t.Helper()
	fams, err := reg.Gather()
	require.NoError(t, err)
	out := map[string]float64{}
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			var labels []string
			for _, l := range m.GetLabel() {
				labels = append(labels, fmt.Sprintf("%s=%q", l.GetName(), l.GetValue()))
			}
			out[strings.Join(labels, ",")] = m.GetCounter().GetValue() + m.GetGauge().GetValue()
		}
	}
	return out
}

// TestWorker_PausedGaugeFollowsResumeByAnotherProcess: ctl credentials resume changes Redis
// only; the worker's gauge follows within its refresh interval, with no job on the credential.
func TestWorker_PausedGaugeFollowsResumeByAnotherProcess(t *testing.T) {
	t.Parallel()
	b := setup(t, worker.Options{PauseRefreshInterval: 20 * time.Millisecond})
	b.run(t)
	// Another process (ctl) with its own limiter on the same Redis.
	lim, err := limiter.New(redistest.Client(t), &limiter.Config{Prefix: b.prefix})
	require.NoError(t, err)
	cred, _ := b.cfg.Credential("default")
	gate := lim.Gate(cred.LimiterID(), cred.Name)
	paused := func(want float64) func() bool {
		return func() bool {
			v, ok := values(t, b.reg, "llmq_limiter_paused")[`credential="default"`]
			return ok && v == want
		}
	}

	started, err := gate.Pause(context.Background(), "rate_limited_no_retry_after", "job-1")
	require.NoError(t, err)
	require.True(t, started)
	require.Eventually(t, paused(1), 30*time.Second, 5*time.Millisecond)
	was, err := gate.Resume(context.Background())
	require.NoError(t, err)
	require.True(t, was)
	require.Eventually(t, paused(0), 30*time.Second, 5*time.Millisecond)
}

// TestWorker_RestoresAPauseRedisLost: a pause kept in Postgres that Redis lost (a restart
// without persistence, a flush) is written back by the worker's refresh, with no job on the
// credential, and its gauge stays 1.
func TestWorker_RestoresAPauseRedisLost(t *testing.T) {
	t.Parallel()
	b := setup(t, worker.Options{PauseRefreshInterval: 20 * time.Millisecond})
	b.run(t)
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, b.cfg.DatabaseURL)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	lim, err := limiter.New(redistest.Client(t), &limiter.Config{Prefix: b.prefix})
	require.NoError(t, err)
	cred, _ := b.cfg.Credential("default")
	gate := lim.Gate(cred.LimiterID(), cred.Name)
	_, err = credpause.NewStore(pool, nil).Pause(ctx, gate, "rate_limited_no_retry_after", "job-1")
	require.NoError(t, err)

	redistest.Unlink(ctx, redistest.Client(t), b.prefix+"*") // Redis loses every key of the test
	require.Eventually(t, func() bool {
		ps, err := gate.Paused(ctx)
		return err == nil && ps.Paused && ps.FirstJobID == "job-1"
	}, 30*time.Second, 10*time.Millisecond, "the pause Redis lost was not restored")
	require.Eventually(t, func() bool {
		v, ok := values(t, b.reg, "llmq_limiter_paused")[`credential="default"`]
		return ok && v == 1
	}, 30*time.Second, 5*time.Millisecond)
}

// TestWorker_RestoresAPauseAFailoverLost: a pause kept in Postgres that Redis lost in a failover
// (the replica that took over held the credential's earlier "not paused": the pause hash missing
// beside its known flag) is written back by the worker's refresh, where nothing else would: the
// credential's jobs were sent until a spend cap paused it again, each dead-lettered.
func TestWorker_RestoresAPauseAFailoverLost(t *testing.T) {
	t.Parallel()
	b := setup(t, worker.Options{PauseRefreshInterval: 20 * time.Millisecond})
	b.run(t)
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, b.cfg.DatabaseURL)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	rdb := redistest.Client(t)
	lim, err := limiter.New(rdb, &limiter.Config{Prefix: b.prefix})
	require.NoError(t, err)
	cred, _ := b.cfg.Credential("default")
	gate := lim.Gate(cred.LimiterID(), cred.Name)
	_, err = credpause.NewStore(pool, nil).Pause(ctx, gate, "rate_limited_no_retry_after", "job-1")
	require.NoError(t, err)

	key := b.prefix + gate.Tag() + ":pause"
	require.NoError(t, rdb.Del(ctx, key).Err()) // the failover: the state before the pause
	require.NoError(t, rdb.Set(ctx, key+":known", "1", 0).Err())
	require.Eventually(t, func() bool {
		ps, err := gate.Paused(ctx)
		return err == nil && ps.Paused && ps.FirstJobID == "job-1"
	}, 30*time.Second, 10*time.Millisecond, "the pause the failover lost was not restored")
}

// TestWorker_PublishesCredentialTags: the worker writes each credential's Redis tag under its
// name at start, and again at each pause refresh (here after a loss of the hash), so that the
// console, which has no provider keys, finds the credential's shared state.
func TestWorker_PublishesCredentialTags(t *testing.T) {
	t.Parallel()
	b := setup(t, worker.Options{PauseRefreshInterval: 20 * time.Millisecond})
	rdb := redistest.Client(t)
	key := redisscript.CredentialIndexKey(b.prefix)
	want := map[string]string{}
	for _, c := range b.cfg.Credentials {
		want[c.Name] = redisscript.CredentialTag(c.LimiterID())
	}
	b.run(t)
	ctx := context.Background()
	require.Eventually(t, func() bool {
		got, err := rdb.HGetAll(ctx, key).Result()
		return err == nil && fmt.Sprint(got) == fmt.Sprint(want)
	}, 30*time.Second, 10*time.Millisecond)
	require.NoError(t, rdb.Del(ctx, key).Err())
	require.Eventually(t, func() bool {
		n, err := rdb.HLen(ctx, key).Result()
		return err == nil && n == int64(len(want))
	}, 30*time.Second, 10*time.Millisecond)
}

// TestWorker_PublishesCredentialTagsUnderTheDefaultPrefix: a worker started as the processes
// start it (no prefix given) publishes the tags where a console with its default prefix reads
// them. Before, it wrote them under no prefix at all, and the console knew no credential. On a
// Redis of its own, so that the default prefix's keys are nobody else's.
func TestWorker_PublishesCredentialTagsUnderTheDefaultPrefix(t *testing.T) {
	t.Parallel()
	url := redistest.Server(t)
	cfg, pool := testConfig(t, url, "")
	w, err := worker.New(context.Background(), cfg, pool, worker.Options{})
	require.NoError(t, err)
	b := &testBundle{cfg: cfg, w: w}
	b.run(t)

	opt, err := redis.ParseURL(url)
	require.NoError(t, err)
	rdb := redis.NewClient(opt)
	t.Cleanup(func() { _ = rdb.Close() })
	want := redisscript.CredentialTag(cfg.Credentials[0].LimiterID())
	require.Eventually(t, func() bool {
		got, err := rdb.HGet(context.Background(), redisscript.CredentialIndexKey(redisscript.DefaultPrefix), "default").Result()
		return err == nil && got == want
	}, 30*time.Second, 10*time.Millisecond, "no tag where the console reads it")
}

// TestWorker_BreakerGaugeFollowsAnotherProcess: llmq_breaker_state shows the breaker as Redis
// holds it, opened and closed by another process, with no job on the credential here: a worker
// whose jobs left an open breaker's credential (their fallbacks took them) showed it open for
// as long as it ran, and one that never sent on it had no series.
func TestWorker_BreakerGaugeFollowsAnotherProcess(t *testing.T) {
	t.Parallel()
	b := setup(t, worker.Options{PauseRefreshInterval: 20 * time.Millisecond})
	b.run(t)
	ctx := context.Background()
	// Another process with its own breaker on the same Redis.
	br, err := breaker.New(redistest.Client(t), &breaker.Config{Prefix: b.prefix, Threshold: 1, Cooldown: time.Millisecond,
		SuccessMemory: -1})
	require.NoError(t, err)
	cred, _ := b.cfg.Credential("default")
	circuit := br.Circuit(cred.LimiterID(), cred.Name)
	state := func(want string) func() bool {
		return func() bool {
			v, ok := values(t, b.reg, "llmq_breaker_state")[`credential="default",state="`+want+`"`]
			return ok && v == 1
		}
	}

	a, err := circuit.Allow(ctx)
	require.NoError(t, err)
	require.True(t, a.Allowed)
	st, err := circuit.Report(ctx, a, breaker.Failure)
	require.NoError(t, err)
	require.Equal(t, breaker.Open, st)
	require.Eventually(t, state("open"), 30*time.Second, 5*time.Millisecond)

	// The cooldown (1 ms) ends: the next Allow is the probe, whose success closes the breaker.
	probe := make(chan breaker.Admission, 1)
	require.Eventually(t, func() bool {
		a, err := circuit.Allow(ctx)
		if err == nil && a.Probe {
			probe <- a
		}
		return err == nil && a.Probe
	}, 30*time.Second, 5*time.Millisecond)
	st, err = circuit.Report(ctx, <-probe, breaker.Success)
	require.NoError(t, err)
	require.Equal(t, breaker.Closed, st)
	require.Eventually(t, state("closed"), 30*time.Second, 5*time.Millisecond)
}
