package process_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/llmq/llmq/internal/llmsim"
	"github.com/llmq/llmq/internal/logtest"
	"github.com/llmq/llmq/internal/pgtest"
	"github.com/llmq/llmq/internal/process"
	"github.com/llmq/llmq/internal/redistest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// pgxpool's background health check ends after the test's pool.Close.
		goleak.IgnoreTopFunction("internal/poll.runtime_pollWait"),
	)
}

// writeConfig writes a config for a fresh database, a private Redis and the simulator at simURL,
// and returns its path.
func writeConfig(t *testing.T, simURL string) string {
	t.Helper()
	return writeConfigOn(t, simURL, redistest.Server(t))
}

// writeConfigOn is writeConfig on the Redis at redisURL.
func writeConfigOn(t *testing.T, simURL, redisURL string) string {
	t.Helper()
	yaml := fmt.Sprintf(`
database_url: %s
redis_url: %s
api: { listen: "127.0.0.1:0", allow_anonymous: true }
worker: { concurrency: 10, metrics_listen: "off" }
credentials:
  - { name: default, provider: anthropic, base_url: %s, api_key_env: SIM_KEY }
`, pgtest.URL(t), redisURL, simURL)
	path := filepath.Join(t.TempDir(), "llmq.yaml")
	require.NoError(t, os.WriteFile(path, []byte(yaml), 0o600))
	return path
}

func getenv(k string) string {
	if k == "SIM_KEY" {
		return "sk-sim"
	}
	return ""
}

// TestServe_RunsAJobInOneProcess: `llmq serve` takes a submit, runs the job with its own worker
// (handed over in the process, without an asynq task) and stores the result; its /metrics holds both halves' metrics; it stops when its context ends.
func TestServe_RunsAJobInOneProcess(t *testing.T) {
	sim := httptest.NewServer(llmsim.New(llmsim.Config{}))
	t.Cleanup(sim.Close)
	cfgPath := writeConfig(t, sim.URL)

	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan string, 1)
	done := make(chan error, 1)
	logs := &logtest.Buffer{}
	go func() {
		done <- process.Serve(ctx, []string{"--config", cfgPath}, process.Options{
			Stderr: logs, Getenv: getenv, Ready: func(addr string) { ready <- addr }})
	}()
	stopped := false
	stop := func() error {
		cancel()
		if stopped {
			return nil
		}
		stopped = true
		select {
		case err := <-done:
			return err
		case <-time.After(30 * time.Second):
			return fmt.Errorf("serve did not stop within 30s of its context's end")
		}
	}
	// Stopped before the stores go away (cleanups run last in, first out), also on a failure.
	t.Cleanup(func() { _ = stop() })
	var base string
	select {
	case addr := <-ready:
		base = "http://" + addr
	case err := <-done:
		t.Fatalf("serve ended before listening: %v\n%s", err, logs)
	case <-time.After(60 * time.Second):
		t.Fatalf("serve did not listen within 60s\n%s", logs)
	}
	hc := &http.Client{Timeout: 30 * time.Second}

	body := `{"request": {"model": "claude-sonnet-4-5", "max_tokens": 16, "messages": [{"role": "user", "content": "Say hello"}]}}`
	resp, err := hc.Post(base+"/v1/jobs", "application/json", strings.NewReader(body))
	require.NoError(t, err)
	var job struct {
		ID, Status string
		Result     json.RawMessage
	}
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&job))
	resp.Body.Close()
	require.Equal(t, http.StatusAccepted, resp.StatusCode)

	// The events stream ends with the job: no polling loop.
	ev, err := hc.Get(base + "/v1/jobs/" + job.ID + "/events")
	require.NoError(t, err)
	events, err := io.ReadAll(ev.Body)
	ev.Body.Close()
	require.NoError(t, err)
	require.Contains(t, string(events), "event: succeeded", "the job ends in serve's own worker")

	resp, err = hc.Get(base + "/v1/jobs/" + job.ID)
	require.NoError(t, err)
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&job))
	resp.Body.Close()
	require.Equal(t, "succeeded", job.Status)
	require.Contains(t, string(job.Result), "llmsim reply to: Say hello")

	// The worker counts a job after storing it: read /metrics until its count is there.
	want := []string{
		`llmq_jobs_submitted_total{credential="default"} 1`,                   // the API's
		`llmq_attempts_total{class="ok",credential="default"} 1`,              // the worker's
		`llmq_jobs_finished_total{credential="default",status="succeeded"} 1`, // both count in it
		// The job was not enqueued: its first delivery ran in this process (dispatch.Handoff).
		`llmq_worker_handoffs_total{outcome="taken"} 1`,
		`llmq_worker_handoffs_total{outcome="returned"} 0`,
		// The pool's saturation (pgwait.Collector), shared by both halves: 16 by default.
		`llmq_postgres_pool_max_connections 16`,
	}
	missing := want
	for deadline := time.Now().Add(30 * time.Second); len(missing) > 0 && time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		resp, err = hc.Get(base + "/metrics")
		require.NoError(t, err)
		metrics, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.NoError(t, err)
		missing = nil
		for _, series := range want {
			if !strings.Contains(string(metrics), series+"\n") {
				missing = append(missing, series)
			}
		}
	}
	require.Empty(t, missing, "/metrics lacks these series")
	require.NoError(t, stop())
}

// TestServe_BadConfigNamesTheProblem: a config that fails validation stops serve before it
// opens anything, with the config's own error.
func TestServe_BadConfigNamesTheProblem(t *testing.T) {
	path := filepath.Join(t.TempDir(), "llmq.yaml")
	require.NoError(t, os.WriteFile(path, []byte("database_url: postgres://x\nredis_url: redis://x\nworker: { concurrency: -1 }\n"), 0o600))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err := process.Serve(ctx, []string{"--config", path}, process.Options{Stderr: io.Discard, Getenv: getenv})
	require.ErrorContains(t, err, "concurrency")
}

// TestWorker_MetricsPortTakenClosesWhatItOpened: a worker whose metrics address is taken
// returns the error having closed the Redis clients it opened, with their goroutines (an
// embedding caller that retries must not pile them up).
func TestWorker_MetricsPortTakenClosesWhatItOpened(t *testing.T) {
	sim := httptest.NewServer(llmsim.New(llmsim.Config{}))
	t.Cleanup(sim.Close)
	cfgPath := writeConfig(t, sim.URL)
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { _ = taken.Close() })
	before := goleak.IgnoreCurrent()

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err = process.Worker(ctx, []string{"--config", cfgPath, "--metrics-listen", taken.Addr().String()},
		process.Options{Stderr: io.Discard, Getenv: getenv})
	require.ErrorContains(t, err, "metrics")
	goleak.VerifyNone(t, before, goleak.IgnoreTopFunction("internal/poll.runtime_pollWait"))
}

// TestServe_APIAddressTakenStartsNoWorker: a serve process whose API cannot listen (its
// address taken: the process it replaces still running, two on one host) fails at once with
// the address, without having started its worker, which would take tasks from asynq, start
// their calls and lead the sweeper only to be stopped again.
func TestServe_APIAddressTakenStartsNoWorker(t *testing.T) {
	sim := httptest.NewServer(llmsim.New(llmsim.Config{}))
	t.Cleanup(sim.Close)
	cfgPath := writeConfig(t, sim.URL)
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { _ = taken.Close() })

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	logs := &logtest.Buffer{}
	err = process.Serve(ctx, []string{"--config", cfgPath, "--listen", taken.Addr().String()},
		process.Options{Stderr: logs, Getenv: getenv, Ready: func(string) { t.Error("Ready called for a server that does not listen") }})
	require.ErrorContains(t, err, "listen on "+taken.Addr().String())
	require.NotContains(t, logs.String(), "worker started", "the worker started before the API could listen")
}

// TestServe_SaysItDoesNotUseWorkerMetricsListen: a serve process serves every metric on the
// API's /metrics; a worker.metrics_listen the operator set (to scrape the worker there) is not
// used, and the process says so at its start instead of leaving the address silently empty.
func TestServe_SaysItDoesNotUseWorkerMetricsListen(t *testing.T) {
	sim := httptest.NewServer(llmsim.New(llmsim.Config{}))
	t.Cleanup(sim.Close)
	cfgPath := writeConfig(t, sim.URL)
	data, err := os.ReadFile(cfgPath)
	require.NoError(t, err)
	data = []byte(strings.Replace(string(data), `metrics_listen: "off"`, `metrics_listen: "127.0.0.1:1"`, 1))
	require.NoError(t, os.WriteFile(cfgPath, data, 0o600))
	taken, err := net.Listen("tcp", "127.0.0.1:0") // the API fails to listen: the test ends at once
	require.NoError(t, err)
	t.Cleanup(func() { _ = taken.Close() })

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	logs := &logtest.Buffer{}
	err = process.Serve(ctx, []string{"--config", cfgPath, "--listen", taken.Addr().String()},
		process.Options{Stderr: logs, Getenv: getenv})
	require.Error(t, err)
	require.Contains(t, logs.String(), `"msg":"worker.metrics_listen is not used by llmq serve`)
	require.Contains(t, logs.String(), `"worker.metrics_listen":"127.0.0.1:1"`)
}
