package backlog_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/backlog"
	"github.com/llmq/llmq/internal/clocktest"
	"github.com/llmq/llmq/internal/jobs"
	"github.com/llmq/llmq/internal/pgtest"
)

// insert adds a job of status and lane submitted ago before at (its deadline an hour after, as a
// submit sets it).
func insert(t *testing.T, pool *pgxpool.Pool, status jobs.Status, lane string, at time.Time, ago time.Duration) {
	t.Helper()
	_, err := pool.Exec(t.Context(), `INSERT INTO jobs (id, credential, fingerprint, status, request, max_attempts,
	timeout_ms, deadline, created_at, lane, finished_at)
VALUES (gen_random_uuid(), 'c', 'f', $1, '{}', 3, 3600000, $2::timestamptz + interval '1 hour', $2, $3,
	CASE WHEN $1 IN ('succeeded', 'failed', 'dead', 'canceled') THEN $2 END)`, string(status), at.Add(-ago), lane)
	require.NoError(t, err)
}

// TestGauge_Measure: the figures are the online lane's jobs queued and retrying, and the age of
// the oldest of them on the injected clock; a running job, a batch-lane job and a finished one
// are not waiting, however old. With none waiting, every figure is 0, not absent.
func TestGauge_Measure(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	clock := clocktest.New(now)
	reg := prometheus.NewRegistry()
	g := backlog.New(backlog.Config{Pool: pool, Now: clock.Now, Metrics: backlog.NewMetrics(reg)})

	f, err := g.Measure(t.Context())
	require.NoError(t, err)
	require.Equal(t, map[jobs.Status]int64{jobs.StatusQueued: 0, jobs.StatusRetrying: 0}, f.Waiting)
	require.Zero(t, f.OldestAge())
	require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP llmq_jobs_oldest_waiting_age_seconds How long the oldest of the online lane's jobs waiting for an attempt had waited (since its submission, or its retry from dead) at the last measurement; 0: none waits. Only the leader exports it.
# TYPE llmq_jobs_oldest_waiting_age_seconds gauge
llmq_jobs_oldest_waiting_age_seconds 0
`), "llmq_jobs_oldest_waiting_age_seconds"))

	insert(t, pool, jobs.StatusQueued, "online", now, 5*time.Minute)
	insert(t, pool, jobs.StatusQueued, "online", now, 10*time.Minute)
	insert(t, pool, jobs.StatusRetrying, "online", now, 20*time.Minute)
	insert(t, pool, jobs.StatusRunning, "online", now, time.Hour)
	insert(t, pool, jobs.StatusQueued, "batch", now, 2*time.Hour)
	insert(t, pool, jobs.StatusSucceeded, "online", now, 3*time.Hour)
	insert(t, pool, jobs.StatusDead, "online", now, 4*time.Hour)
	clock.Advance(30 * time.Second)

	f, err = g.Measure(t.Context())
	require.NoError(t, err)
	require.Equal(t, map[jobs.Status]int64{jobs.StatusQueued: 2, jobs.StatusRetrying: 1}, f.Waiting)
	require.Equal(t, 20*time.Minute+30*time.Second, f.OldestAge())
	require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP llmq_jobs_oldest_waiting_age_seconds How long the oldest of the online lane's jobs waiting for an attempt had waited (since its submission, or its retry from dead) at the last measurement; 0: none waits. Only the leader exports it.
# TYPE llmq_jobs_oldest_waiting_age_seconds gauge
llmq_jobs_oldest_waiting_age_seconds 1230
# HELP llmq_jobs_waiting The online lane's jobs waiting for an attempt, by status (queued, retrying), measured in Postgres by the worker leading maintenance every 15 s. Only the leader exports it.
# TYPE llmq_jobs_waiting gauge
llmq_jobs_waiting{status="queued"} 2
llmq_jobs_waiting{status="retrying"} 1
`), "llmq_jobs_waiting", "llmq_jobs_oldest_waiting_age_seconds"))
	require.Equal(t, float64(now.Add(30*time.Second).Unix()),
		testutil.ToFloat64(gauge(t, reg, "llmq_jobs_waiting_last_success_timestamp_seconds")))
}

// gauge returns the one series of name in reg as a collector testutil.ToFloat64 reads.
func gauge(t *testing.T, reg *prometheus.Registry, name string) prometheus.Gauge {
	t.Helper()
	fams, err := reg.Gather()
	require.NoError(t, err)
	for _, f := range fams {
		if f.GetName() == name {
			require.Len(t, f.GetMetric(), 1, name)
			g := prometheus.NewGauge(prometheus.GaugeOpts{Name: name})
			g.Set(f.GetMetric()[0].GetGauge().GetValue())
			return g
		}
	}
	t.Fatalf("%s: no series", name)
	return nil
}

// TestGauge_FailedMeasurementKeepsItsDate: a measurement Postgres does not answer ends at the
// timeout with an error, and leaves the last figures and their date where they were: a date that
// stops moving shows figures that do not.
func TestGauge_FailedMeasurementKeepsItsDate(t *testing.T) {
	t.Parallel()
	proxy, viaProxy := pgtest.NewProxy(t, pgtest.URL(t))
	// exec: each run sends its SQL text, which the proxy's hold looks for.
	pool, err := pgxpool.New(t.Context(), viaProxy+"&default_query_exec_mode=exec")
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	clock := clocktest.New(now)
	reg := prometheus.NewRegistry()
	g := backlog.New(backlog.Config{Pool: pool, Now: clock.Now, Timeout: 200 * time.Millisecond,
		Metrics: backlog.NewMetrics(reg)})
	insert(t, pool, jobs.StatusQueued, "online", now, time.Minute)
	_, err = g.Measure(t.Context())
	require.NoError(t, err)

	hold := proxy.HoldStatement("GROUP BY status")
	clock.Advance(time.Hour)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	_, err = g.Measure(ctx)
	select {
	case <-hold.Reached():
	default:
		t.Fatal("the measurement was not held")
	}
	hold.Release() // the connection's close goes through then: the pool's Close need not wait for it
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.NoError(t, ctx.Err(), "ended by its own timeout")
	require.Equal(t, float64(now.Unix()),
		testutil.ToFloat64(gauge(t, reg, "llmq_jobs_waiting_last_success_timestamp_seconds")))
	require.Equal(t, float64(60), testutil.ToFloat64(gauge(t, reg, "llmq_jobs_oldest_waiting_age_seconds")))
}

// TestGauge_RunDropsItsFiguresWhenItStops: Run measures at once; when its context ends (the
// process stops leading) the figures go, so that they never stand beside the new leader's, and
// their date stays (the stalled check reads the max over the workers).
func TestGauge_RunDropsItsFiguresWhenItStops(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	reg := prometheus.NewRegistry()
	g := backlog.New(backlog.Config{Pool: pool, Now: clocktest.New(now).Now, Interval: time.Hour,
		Metrics: backlog.NewMetrics(reg)})
	count := func(name string) int {
		n, err := testutil.GatherAndCount(reg, name)
		require.NoError(t, err)
		return n
	}
	require.Zero(t, count("llmq_jobs_waiting"), "absent before a measurement")
	require.Equal(t, 1, count("llmq_jobs_waiting_last_success_timestamp_seconds"), "0 from the start")

	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() {
		defer close(done)
		g.Run(ctx)
	}()
	require.Eventually(t, func() bool { return count("llmq_jobs_waiting") == 2 }, 30*time.Second, 5*time.Millisecond,
		"measured at once, not an interval later")
	cancel()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("Run did not return after its context ended")
	}
	require.Zero(t, count("llmq_jobs_waiting"))
	require.Zero(t, count("llmq_jobs_oldest_waiting_age_seconds"))
	require.Equal(t, float64(now.Unix()),
		testutil.ToFloat64(gauge(t, reg, "llmq_jobs_waiting_last_success_timestamp_seconds")))
}

// TestGauge_RetriedDeadLetterWaitsFromItsRetry: a dead letter retried (`ctl dead retry`, the
// console) waits from its retry, not from its first submission: a retry of jobs that died days
// ago is no job that has waited days, and must not page the operator who just retried them
// (LLMQJobsWaitingTooLong reads the oldest age).
func TestGauge_RetriedDeadLetterWaitsFromItsRetry(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := pgtest.Pool(t)
	var id string
	var dbNow time.Time
	require.NoError(t, pool.QueryRow(ctx, `INSERT INTO jobs (id, credential, fingerprint, status, request,
	max_attempts, timeout_ms, deadline, created_at, lane, finished_at, dead_reason)
VALUES (gen_random_uuid(), 'c', 'f', 'dead', '{}', 3, 600000, now() - interval '3 days' + interval '10 minutes',
	now() - interval '3 days', 'online', now() - interval '3 days', 'retries_exhausted')
RETURNING id::text, now()`).Scan(&id, &dbNow))
	retried, err := jobs.NewStore(pool, nil).RetryDead(ctx, jobs.DeadFilter{IDs: []string{id}}, nil)
	require.NoError(t, err)
	require.Len(t, retried, 1)

	// Measured a minute after the retry, on Postgres's clock (the retry's).
	g := backlog.New(backlog.Config{Pool: pool, Now: clocktest.New(dbNow.Add(time.Minute)).Now})
	f, err := g.Measure(ctx)
	require.NoError(t, err)
	require.Equal(t, int64(1), f.Waiting[jobs.StatusQueued])
	require.Less(t, f.OldestAge(), 2*time.Minute, "waits from its retry, not from %v ago", 72*time.Hour)
	require.Greater(t, f.OldestAge(), 30*time.Second)
}
