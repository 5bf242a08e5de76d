package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/console"
	"github.com/llmq/llmq/internal/dispatch"
	"github.com/llmq/llmq/internal/jobs"
	"github.com/llmq/llmq/internal/operator"
	"github.com/llmq/llmq/internal/pgtest"
	"github.com/llmq/llmq/internal/redistest"
)

func TestStats(t *testing.T) {
	t.Parallel()
	b := setupJobs(t)
	redis, insp, queue := redisArgs(t)
	ctx := context.Background()
	// Two successes (1s and 3s from submit, one after a retry), one dead after two attempts,
	// one queued with its task pending.
	ok1 := b.createJob(t)
	b.attempt(t, ok1.ID, jobs.Outcome{Status: jobs.StatusSucceeded})
	ok2 := b.createJob(t)
	b.attempt(t, ok2.ID, jobs.Outcome{Status: jobs.StatusRetrying})
	b.attempt(t, ok2.ID, jobs.Outcome{Status: jobs.StatusSucceeded})
	b.deadJob(t, "default", jobs.ReasonRetriesExhausted, 2)
	queued := b.createJob(t)
	_, err := b.pool.Exec(ctx, `UPDATE jobs SET finished_at = deadline - timeout_ms * interval '1 millisecond' + interval '1 second' WHERE id = $1`, ok1.ID)
	require.NoError(t, err)
	_, err = b.pool.Exec(ctx, `UPDATE jobs SET finished_at = deadline - timeout_ms * interval '1 millisecond' + interval '3 seconds' WHERE id = $1`, ok2.ID)
	require.NoError(t, err)
	opt, err := dispatch.RedisConnOpt(redisArgsURL(redis))
	require.NoError(t, err)
	client := asynq.NewClient(opt)
	defer client.Close()
	require.NoError(t, dispatch.NewEnqueuer(client, queue, nil).Enqueue(ctx, queued.ID, "", time.Time{}))

	t.Run("Table", func(t *testing.T) {
		t.Parallel()
		r := run(t, append(append([]string{"--database-url", b.url}, redis...), "stats")...)
		require.Equal(t, 0, r.code, "stderr %q", r.errOut)
		require.Empty(t, r.errOut)
		require.Equal(t, map[string]string{
			"window":               "1h0m0s",
			"jobs submitted":       "4",
			"jobs queued now":      "1",
			"jobs running now":     "0",
			"jobs retrying now":    "0",
			"jobs succeeded":       "2",
			"jobs failed":          "0",
			"jobs dead":            "1",
			"jobs canceled":        "0",
			"queue pending":        "1",
			"queue active":         "0",
			"queue scheduled":      "0",
			"queue retry":          "0",
			"queue archived":       "0",
			"attempts":             "5",
			"retries":              "2",
			"retry rate":           "40.0%",
			"requests per success": "2.50",
			"submit→result p50":    "2s",
			"submit→result p95":    "2.9s",
		}, fields(r.out))
	})
	t.Run("JSON", func(t *testing.T) {
		t.Parallel()
		r := run(t, append(append([]string{"--database-url", b.url}, redis...), "stats", "--json", "--window", "2h")...)
		require.Equal(t, 0, r.code, "stderr %q", r.errOut)
		var got struct {
			Window             string         `json:"window"`
			ByStatus           map[string]int `json:"jobs_by_status"`
			Submitted          int            `json:"jobs_submitted"`
			Queue              dispatch.QueueDepth
			Attempts           int     `json:"attempts"`
			Retries            int     `json:"retries"`
			RetryRate          float64 `json:"retry_rate"`
			RequestsPerSuccess float64 `json:"requests_per_success"`
			P50                float64 `json:"submit_to_result_p50_ms"`
			P95                float64 `json:"submit_to_result_p95_ms"`
		}
		require.NoError(t, json.Unmarshal([]byte(r.out), &got), "output %q", r.out)
		require.Equal(t, "2h0m0s", got.Window)
		require.Equal(t, map[string]int{"queued": 1, "running": 0, "retrying": 0, "succeeded": 2, "failed": 0, "dead": 1, "canceled": 0}, got.ByStatus)
		require.Equal(t, 4, got.Submitted)
		require.Equal(t, dispatch.QueueDepth{Pending: 1}, got.Queue)
		require.Equal(t, 5, got.Attempts)
		require.Equal(t, 2, got.Retries)
		require.InDelta(t, 0.4, got.RetryRate, 1e-9)
		require.InDelta(t, 2.5, got.RequestsPerSuccess, 1e-9)
		require.InDelta(t, 2000, got.P50, 1)
		require.InDelta(t, 2900, got.P95, 1)
	})
	t.Run("SameAsConsoleOverview", func(t *testing.T) {
		// The console's overview and ctl stats read one window of the same database: every
		// figure ctl prints as JSON, the overview shows too, with the same value (the overview
		// gives no window start, its window moving with each recomputation; ctl has no dead
		// letters by reason).
		t.Parallel()
		rdb := redistest.Client(t)
		tasks := dispatch.NewTasks(insp, dispatch.NewEnqueuer(client, queue, nil))
		h, err := console.New(console.Config{Pool: b.pool, Jobs: b.store, Redis: rdb,
			RedisPrefix: redistest.Prefix(t), Tasks: tasks})
		require.NoError(t, err)
		srv := httptest.NewServer(h)
		t.Cleanup(srv.Close)
		_, token, err := operator.NewStore(b.pool, nil).Create(ctx, "alice")
		require.NoError(t, err)
		jar, err := cookiejar.New(nil)
		require.NoError(t, err)
		browser := &http.Client{Jar: jar, Timeout: 30 * time.Second}
		login, err := browser.Post(srv.URL+"/console/api/login", "application/json",
			strings.NewReader(`{"token":"`+token+`"}`))
		require.NoError(t, err)
		require.NoError(t, login.Body.Close())
		require.Equal(t, http.StatusOK, login.StatusCode)
		res, err := browser.Get(srv.URL + "/console/api/overview")
		require.NoError(t, err)
		defer res.Body.Close()
		require.Equal(t, http.StatusOK, res.StatusCode)
		var overview map[string]any
		require.NoError(t, json.NewDecoder(res.Body).Decode(&overview))
		require.Contains(t, overview, "dead_by_reason")
		delete(overview, "dead_by_reason")

		r := run(t, append(append([]string{"--database-url", b.url}, redis...), "stats", "--json")...)
		require.Equal(t, 0, r.code, "stderr %q", r.errOut)
		var stats map[string]any
		require.NoError(t, json.Unmarshal([]byte(r.out), &stats), "output %q", r.out)
		require.Contains(t, stats, "since")
		delete(stats, "since")
		require.Equal(t, stats, overview)
	})
	t.Run("EmptyWindowHasDashes", func(t *testing.T) {
		t.Parallel()
		e := setupJobs(t)
		r := run(t, append(append([]string{"--database-url", e.url}, redis...), "stats", "--window", "30m")...)
		require.Equal(t, 0, r.code, "stderr %q", r.errOut)
		rows := fields(r.out)
		require.Equal(t, "-", rows["retry rate"])
		require.Equal(t, "-", rows["submit→result p50"])
	})
	t.Run("WindowPastRetention", func(t *testing.T) {
		// The retention pass deletes the jobs that ended longer ago than their status's period:
		// a window past it counts only the jobs still kept, which ctl says rather than print
		// counts that look whole (30 days of dead letters beside 7 of successes).
		t.Parallel()
		dir := t.TempDir()
		keyFile := filepath.Join(dir, "key")
		require.NoError(t, os.WriteFile(keyFile, []byte("k\n"), 0o600))
		cfgFile := filepath.Join(dir, "llmq.yaml")
		require.NoError(t, os.WriteFile(cfgFile, fmt.Appendf(nil, `database_url: %q
credentials:
  - { name: default, provider: anthropic, base_url: "http://127.0.0.1:8090", api_key_file: %q }
retention: { succeeded: 1d, failed: 2d, canceled: off }
`, b.url, keyFile), 0o600))
		args := append(append([]string{"--config", cfgFile}, redis...), "stats")

		r := run(t, append(args, "--window", "36h")...)
		require.Equal(t, 0, r.code, "stderr %q", r.errOut)
		require.Equal(t, "ctl: note: the window (36h0m0s) is longer than retention.succeeded (24h0m0s): "+
			"jobs that ended before it were deleted and are not counted\n", r.errOut)
		require.Equal(t, "2", fields(r.out)["jobs succeeded"], "the counts are printed all the same")

		r = run(t, append(args, "--window", "24h", "--json")...)
		require.Equal(t, 0, r.code, "stderr %q", r.errOut)
		require.Empty(t, r.errOut, "within every period")
		r = run(t, append(args, "--window", "3d", "--json")...)
		require.Equal(t, 0, r.code, "stderr %q", r.errOut)
		require.Contains(t, r.errOut, "retention.succeeded (24h0m0s)")
		require.Contains(t, r.errOut, "retention.failed (48h0m0s)")
		require.NotContains(t, r.errOut, "canceled", "off: kept forever")
		require.NotContains(t, r.errOut, "retention.dead", "30d by default")
		require.True(t, json.Valid([]byte(r.out)), "the JSON is whole: %q", r.out)
	})
	t.Run("BadWindow", func(t *testing.T) {
		t.Parallel()
		r := run(t, "--database-url", b.url, "stats", "--window", "0s")
		requireOneLineError(t, r, 2, "--window")
	})
}

// TestStats_RedisDownStillCounts: the figures are Postgres's; only the queue depth is Redis's.
// With Redis unreachable, stats prints the figures with the queue unknown and a note, as the
// console's overview does (its queue null), instead of failing with no figure at all, in the
// outage its figures help with.
func TestStats_RedisDownStillCounts(t *testing.T) {
	t.Parallel()
	b := setupJobs(t)
	b.createJob(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	down := "redis://" + ln.Addr().String()
	require.NoError(t, ln.Close()) // nothing listens there now: refused

	r := run(t, "--database-url", b.url, "--redis-url", down, "stats")
	require.Equal(t, 0, r.code, "stderr %q", r.errOut)
	rows := fields(r.out)
	require.Equal(t, "1", rows["jobs queued now"])
	require.Equal(t, "1", rows["jobs submitted"])
	require.Equal(t, "-", rows["queue pending"])
	require.Equal(t, "-", rows["queue archived"])
	require.Contains(t, r.errOut, "ctl: note: queue depth unknown: redis unreachable")

	r = run(t, "--database-url", b.url, "--redis-url", down, "stats", "--json")
	require.Equal(t, 0, r.code, "stderr %q", r.errOut)
	var got struct {
		Queue    *dispatch.QueueDepth `json:"queue"`
		ByStatus map[string]int       `json:"jobs_by_status"`
	}
	require.NoError(t, json.Unmarshal([]byte(r.out), &got), "output %q", r.out)
	require.Nil(t, got.Queue)
	require.Equal(t, 1, got.ByStatus["queued"])
}

// TestStats_SilentRedisBesideFigures: with a Redis that accepts connections and never answers,
// stats reads Postgres's figures while it waits for Redis (its ping, a.redisWait), not after:
// the wait is spent once, beside the figures' statements. It pinged Redis first and only then
// connected to Postgres, so the figures came a whole wait (5 s) plus their own time late.
func TestStats_SilentRedisBesideFigures(t *testing.T) {
	t.Parallel()
	b := setupJobs(t)
	b.createJob(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { ln.Close() })
	redisGaveUp := make(chan struct{}) // closed when ctl closes a connection to the silent Redis
	go func() {
		var once sync.Once
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer conn.Close()
				_, _ = io.Copy(io.Discard, conn) // read and never answer, until ctl closes it
				once.Do(func() { close(redisGaveUp) })
			}()
		}
	}()
	proxy, proxied := pgtest.NewProxy(t, b.url)
	figures := proxy.HoldStatement("jsonb_object_agg(c.status, c.n)") // jobs.Store.Stats
	defer figures.Release()

	done := make(chan result, 1)
	go func() {
		r, _ := runApp(30*time.Second, func(a *app) { a.redisWait = 10 * time.Second },
			"--database-url", proxied, "--redis-url", "redis://"+ln.Addr().String(), "stats")
		done <- r
	}()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	select {
	case <-figures.Reached():
	case <-redisGaveUp:
		t.Fatal("the figures waited for Redis")
	case <-ctx.Done():
		t.Fatal("the figures were not read")
	}
	figures.Release()
	select {
	case r := <-done:
		require.Equal(t, 0, r.code, "stderr %q", r.errOut)
		require.Equal(t, "1", fields(r.out)["jobs queued now"])
		require.Equal(t, "-", fields(r.out)["queue pending"])
		require.Contains(t, r.errOut, "ctl: note: queue depth unknown: redis unreachable")
	case <-ctx.Done():
		t.Fatal("ctl did not end")
	}
}
