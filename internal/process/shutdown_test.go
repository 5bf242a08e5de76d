package process_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/llmsim"
	"github.com/llmq/llmq/internal/logtest"
	"github.com/llmq/llmq/internal/pgtest"
	"github.com/llmq/llmq/internal/process"
	"github.com/llmq/llmq/internal/redistest"
)

// TestServe_ShutdownRecordsCutCalls: a process stopped while calls run past the shutdown
// timeout cuts them and, before it returns, records each abandoned attempt and gives its job's
// lease back: the jobs are retrying, free for the next delivery at once (not after their 15 s
// lease), their attempt in their history. The jobs are low, so that asynq's server, not the
// in-process handoff, delivers them; there are several, as on a busy worker, whose cut
// deliveries all record at once.
func TestServe_ShutdownRecordsCutCalls(t *testing.T) {
	const cutCalls = 20
	sim := httptest.NewServer(llmsim.New(llmsim.Config{}))
	t.Cleanup(sim.Close)
	hc := &http.Client{Timeout: 30 * time.Second}
	resp, err := hc.Post(sim.URL+"/_sim/faults", "application/json", strings.NewReader(`{"hang": true}`))
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)

	dbURL := pgtest.URL(t)
	cfgPath := filepath.Join(t.TempDir(), "llmq.yaml")
	require.NoError(t, os.WriteFile(cfgPath, fmt.Appendf(nil, `
database_url: %s
redis_url: %s
api: { listen: "127.0.0.1:0", allow_anonymous: true }
worker: { concurrency: %d, metrics_listen: "off" }
breaker: { cold_start_cap: false }
credentials:
  - { name: default, provider: anthropic, base_url: %s, api_key_env: SIM_KEY,
      limits: { requests_per_second: 1000, burst: 100 } }
`, dbURL, redistest.Server(t), cutCalls, sim.URL), 0o600))

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ready, done, logs := make(chan string, 1), make(chan error, 1), &logtest.Buffer{}
	go func() {
		done <- process.Serve(ctx, []string{"--config", cfgPath}, process.Options{
			Stderr: logs, Getenv: getenv, Ready: func(addr string) { ready <- addr }})
	}()
	stopped := false
	t.Cleanup(func() {
		cancel()
		if !stopped {
			select {
			case <-done:
			case <-time.After(60 * time.Second):
				t.Error("serve did not stop")
			}
		}
	})
	var base string
	select {
	case addr := <-ready:
		base = "http://" + addr
	case err := <-done:
		t.Fatalf("serve ended before listening: %v\n%s", err, logs)
	case <-time.After(60 * time.Second):
		t.Fatalf("serve did not listen within 60s\n%s", logs)
	}

	body := `{"priority": "low", "request": {"model": "claude-sonnet-4-5", "max_tokens": 16, "messages": [{"role": "user", "content": "hang"}]}}`
	ids := make([]string, cutCalls)
	for i := range ids {
		resp, err := hc.Post(base+"/v1/jobs", "application/json", strings.NewReader(body))
		require.NoError(t, err)
		var job struct{ ID string }
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&job))
		resp.Body.Close()
		require.Equal(t, http.StatusAccepted, resp.StatusCode)
		ids[i] = job.ID
	}
	// Wait for every call to be under way: each job's running event.
	sc := &http.Client{Timeout: 30 * time.Second}
	for _, id := range ids {
		ev, err := sc.Get(base + "/v1/jobs/" + id + "/events")
		require.NoError(t, err)
		lines := bufio.NewScanner(ev.Body)
		for lines.Scan() && lines.Text() != "event: running" {
		}
		require.Equal(t, "event: running", lines.Text(), "job %s's events: %v", id, lines.Err())
		ev.Body.Close()
	}

	cancel()
	select {
	case err := <-done:
		stopped = true
		require.NoError(t, err)
	case <-time.After(60 * time.Second):
		t.Fatalf("serve did not stop within 60s\n%s", logs)
	}

	// What the cut calls taught the limiter and the breaker (their tokens, their admissions)
	// reached Redis before the worker closed its clients.
	require.NotContains(t, logs.String(), "after-call bookkeeping", "the cut calls' bookkeeping")

	qctx, qcancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer qcancel()
	conn, err := pgx.Connect(qctx, dbURL)
	require.NoError(t, err)
	defer conn.Close(qctx)
	for _, id := range ids {
		var status string
		var leased bool
		var attempts int
		require.NoError(t, conn.QueryRow(qctx, `SELECT status, lease_token IS NOT NULL,
			(SELECT count(*) FROM job_attempts a WHERE a.job_id = j.id) FROM jobs j WHERE id = $1`, id).
			Scan(&status, &leased, &attempts))
		require.Equal(t, "retrying", status, "job %s: the cut attempt's outcome\n%s", id, logs)
		require.False(t, leased, "job %s: the cut attempt's lease is given back", id)
		require.Equal(t, 1, attempts, "job %s: the cut attempt is recorded", id)
	}
}
