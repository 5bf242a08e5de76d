package main

import (
	"net/http/httptest"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/api"
	"github.com/llmq/llmq/internal/config"
	"github.com/llmq/llmq/internal/executor"
)

// TestLags proves that each token's lag runs from its flush to the read of the delta event that
// completes it, and that the steady lags count only tokens flushed after the first delta read.
func TestLags(t *testing.T) {
	t0 := time.Unix(0, 0)
	ms := func(n int) time.Time { return t0.Add(time.Duration(n) * time.Millisecond) }
	v := &jobView{}
	v.delta(0, "abcd", ms(10))   // completes token 1 (flushed at 1)
	v.delta(4, "efghij", ms(40)) // completes tokens 2 and 3 (flushed at 20 and 30)
	all, steady := lags(nil, nil, []int{4, 8, 10, 12}, []time.Time{ms(1), ms(20), ms(30), ms(35)}, v)
	require.Equal(t, []time.Duration{9 * time.Millisecond, 20 * time.Millisecond, 10 * time.Millisecond}, all,
		"the token the client never got is skipped")
	require.Equal(t, []time.Duration{20 * time.Millisecond, 10 * time.Millisecond}, steady)
	require.Zero(t, v.gaps)

	v.delta(3, "x", ms(50))
	require.Equal(t, 1, v.gaps, "an offset that does not follow the text read")
	_, err := v.event("reset", nil, ms(60))
	require.NoError(t, err)
	require.Empty(t, v.text)
}

// TestRecordingWriter proves that the simulator's content tokens are recorded with their text
// at each flush, and other events ignored.
func TestRecordingWriter(t *testing.T) {
	c := &simCall{}
	w := &recordingWriter{ResponseWriter: httptest.NewRecorder(), call: c}
	_, _ = w.Write([]byte("event: ping\ndata: {}\n\nevent: content_block_delta\ndata: {\"delta\":{\"type\":\"text_delta\",\"text\":\"ab\"}}\n\nevent: content_block_delta\ndata: {\"delta\""))
	require.NoError(t, w.FlushError())
	_, _ = w.Write([]byte(":{\"type\":\"text_delta\",\"text\":\"cd\"}}\n\n"))
	require.NoError(t, w.FlushError())
	text, ends, at := c.snapshot()
	require.Equal(t, "abcd", string(text))
	require.Equal(t, []int{2, 4}, ends)
	require.Len(t, at, 2)
}

// TestSteadyArrivals proves that the steady phase spaces its submits so that -n streams run at
// once (a stream lasts reply-tokens / tps) and fills its length with them.
func TestSteadyArrivals(t *testing.T) {
	b := &streamBench{s: &shared{n: 200}, tokens: 100, tps: 50, steady: 10 * time.Second}
	spacing, jobs := b.steadyArrivals()
	require.Equal(t, 10*time.Millisecond, spacing, "2 s streams, 200 at once")
	require.Equal(t, 1000, jobs)
	b.steady = time.Millisecond
	_, jobs = b.steadyArrivals()
	require.Equal(t, 1, jobs, "a phase shorter than one spacing still submits a job")
	b.s.n, b.tokens, b.tps = 1_000_000_000, 1, 1000
	spacing, _ = b.steadyArrivals()
	require.Equal(t, time.Microsecond, spacing, "more streams than nanoseconds in one: no zero spacing")
}

// TestSteadyTargets proves that the steady phase is judged on its own time to first delta.
func TestSteadyTargets(t *testing.T) {
	b := &streamBench{s: &shared{n: 200}, steadyRun: &streamPhase{spacing: 10 * time.Millisecond}}
	ms := func(n int) time.Duration { return time.Duration(n) * time.Millisecond }
	s := phaseStats{overSim: []time.Duration{ms(3), ms(4), ms(4), ms(30)}}
	rows := b.steadyTargets(s)
	require.Len(t, rows, 2)
	require.Equal(t, []string{"4.0 ms", "PASS"}, rows[0][1:], "p50 within 5 ms")
	require.Equal(t, []string{"30.0 ms", "FAIL"}, rows[1][1:], "p99 over 20 ms")
}

// TestSteadyFanOutTarget proves that the steady fan-out is judged on its largest lag, against
// the same 100 ms as the burst's fan-out.
func TestSteadyFanOutTarget(t *testing.T) {
	b := &streamBench{s: &shared{n: 200}, clients: 5}
	ms := func(n int) time.Duration { return time.Duration(n) * time.Millisecond }
	row := b.steadyFanOutTarget(phaseStats{delivery: delivery{lags: []time.Duration{ms(3), ms(99), ms(2)}}})
	require.Equal(t, []string{"the same, steady (200 streams at once, 5 clients per job)", "99.0 ms", "PASS"}, row)
	row = b.steadyFanOutTarget(phaseStats{delivery: delivery{lags: []time.Duration{ms(3), ms(101)}}})
	require.Equal(t, []string{"101 ms", "FAIL"}, row[1:])
}

// TestStreamConfig proves that the stream bench's edits of the run's config load with llmq's
// own loader: the streams cap, and the pool, the poll interval and the delta spacing only when
// asked for.
func TestStreamConfig(t *testing.T) {
	const db = "postgres://postgres@127.0.0.1:5432/llmq_bench_x?sslmode=disable"
	load := func(t *testing.T, pool int, poll time.Duration, spacing string) *config.Config {
		t.Helper()
		path := filepath.Join(t.TempDir(), "llmq.yaml")
		_, err := writeConfig(path, db, "redis://127.0.0.1:6379/0", "llmq-bench-q", "http://127.0.0.1:9", "sk-x", llmqSetup{})
		require.NoError(t, err)
		require.NoError(t, streamConfig(path, 1000, pool, poll, spacing))
		cfg, err := config.LoadWithoutSecrets(path, func(string) string { return "" })
		require.NoError(t, err)
		return cfg
	}
	cfg := load(t, 0, 0, "")
	require.Equal(t, 1000, cfg.API.MaxStreamsPerTenant)
	require.Equal(t, 100*time.Millisecond, cfg.Worker.PollInterval, "llmq's default poll")
	require.Equal(t, db, cfg.DatabaseURL)
	require.Zero(t, cfg.Streaming.DeltaSpacing, "llmq's default spacing")
	cfg = load(t, 8, 2*time.Millisecond, "40ms")
	require.Equal(t, 2*time.Millisecond, cfg.Worker.PollInterval)
	require.Contains(t, cfg.DatabaseURL, "pool_max_conns=8")
	require.Equal(t, 40*time.Millisecond, cfg.Streaming.DeltaSpacing)
}

// TestSteadyStagesNote proves that the steady phase's stages are reported per job of the phase,
// and that nothing is said when they were not read or there was no steady phase.
func TestSteadyStagesNote(t *testing.T) {
	b := &streamBench{s: &shared{n: 20}, steadyRun: &streamPhase{jobs: make([]*streamJob, 2)}}
	require.Empty(t, b.steadyStagesNote(), "stages not read")
	b.steadyStages = []stageTime{
		{stage: executor.StagePickup, count: 2, meanMS: 2},
		{stage: executor.StageCall, count: 2, meanMS: 2000},
		{stage: api.SubmitStageCreate, count: 2, meanMS: 1.5, submit: true},
	}
	require.Equal(t, "Steady phase, stage mean ms per delivery: pickup 2.00, call 2000.00 (2002.0 ms per job in all); "+
		"of the pick-up, the API's submit stages, mean ms per job: create 1.50 (the call holds the whole stream).", b.steadyStagesNote())
	b.steadyRun = nil
	require.Empty(t, b.steadyStagesNote(), "no steady phase")
}

// TestStreamLayout proves that a -serve run says its jobs went through serve processes, whose CPU
// is the workers' column, and that a run apart names its replicas and workers.
func TestStreamLayout(t *testing.T) {
	b := &streamBench{s: &shared{workers: 2}, apis: 3}
	require.Equal(t, "3 API replicas, each followed (Last-Event-ID: 0) on the next replica(s); 2 workers", b.layout())
	b.serve = true
	require.Contains(t, b.layout(), "2 `llmq serve` processes")
	require.Contains(t, b.layout(), "the API CPU column is empty")
}
