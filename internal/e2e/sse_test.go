package e2e_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/api"
	"github.com/llmq/llmq/internal/llmsim"
)

// sseEvent is one event of a job's stream.
type sseEvent struct {
	name, id string
	job      map[string]any
}

// eventStream is an open GET /v1/jobs/{id}/events.
type eventStream struct {
	resp   *http.Response
	lines  *bufio.Scanner
	cancel context.CancelFunc
}

// openEvents opens a job's event stream on base (with Last-Event-ID unless empty). Reads fail
// after 20s.
func openEvents(t *testing.T, base, id, lastID string) *eventStream {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/v1/jobs/"+id+"/events", nil)
	require.NoError(t, err)
	if lastID != "" {
		req.Header.Set("Last-Event-ID", lastID)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	s := &eventStream{resp: resp, lines: bufio.NewScanner(resp.Body), cancel: cancel}
	s.lines.Buffer(make([]byte, 64<<10), 1<<20)
	t.Cleanup(s.close)
	return s
}

func (s *eventStream) close() {
	s.cancel()
	_ = s.resp.Body.Close()
}

// next returns the next event (comments skipped), or ok=false when the stream ended.
func (s *eventStream) next(t *testing.T) (ev sseEvent, ok bool) {
	t.Helper()
	for s.lines.Scan() {
		line := s.lines.Text()
		switch {
		case line == "":
			if ev.name != "" {
				return ev, true
			}
		case strings.HasPrefix(line, ":"):
		case strings.HasPrefix(line, "event: "):
			ev.name = strings.TrimPrefix(line, "event: ")
		case strings.HasPrefix(line, "id: "):
			ev.id = strings.TrimPrefix(line, "id: ")
		case strings.HasPrefix(line, "data: "):
			require.NoError(t, json.Unmarshal([]byte(strings.TrimPrefix(line, "data: ")), &ev.job))
		default:
			t.Fatalf("unexpected line %q", line)
		}
	}
	require.NoError(t, s.lines.Err())
	return sseEvent{}, false
}

// rest reads the events until the stream ends.
func (s *eventStream) rest(t *testing.T) []sseEvent {
	t.Helper()
	var out []sseEvent
	for {
		ev, ok := s.next(t)
		if !ok {
			return out
		}
		out = append(out, ev)
	}
}

func eventNames(evs []sseEvent) []string {
	out := make([]string, len(evs))
	for i, e := range evs {
		out[i] = e.name + "/" + e.id
	}
	return out
}

// storedEvents returns the job's events as stored, "type/seq", in order.
func (b *testBundle) storedEvents(t *testing.T, id string) []string {
	t.Helper()
	pool, err := openPool(b.ctx, b.dbURL)
	require.NoError(t, err)
	defer pool.Close()
	rows, err := pool.Query(b.ctx, `SELECT type, seq FROM job_events WHERE job_id = $1 ORDER BY seq`, id)
	require.NoError(t, err)
	defer rows.Close()
	var out []string
	for rows.Next() {
		var typ string
		var seq int
		require.NoError(t, rows.Scan(&typ, &seq))
		out = append(out, fmt.Sprintf("%s/%d", typ, seq))
	}
	require.NoError(t, rows.Err())
	return out
}

// replica starts another API process on the test's database and returns its URL.
func (b *testBundle) replica(t *testing.T) string {
	t.Helper()
	pool, err := openPool(b.ctx, b.dbURL)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	srv, closeAPI, err := api.FromConfig(b.cfg, pool, prometheus.NewRegistry(), nil)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, closeAPI()) })
	hs := httptest.NewServer(srv)
	t.Cleanup(hs.Close)
	return hs.URL
}

func count(evs []sseEvent, name string) int {
	n := 0
	for _, e := range evs {
		if e.name == name {
			n++
		}
	}
	return n
}

// requireRetriedTwiceThenSucceeded checks a stream of a whole job that failed twice with 503 and
// then succeeded: every stored transition, in order, the terminal one carrying the result.
func (b *testBundle) requireRetriedTwiceThenSucceeded(t *testing.T, id string, evs []sseEvent) {
	t.Helper()
	require.Equal(t, b.storedEvents(t, id), eventNames(evs), "every transition, in order, once")
	require.Equal(t, "queued", evs[0].name)
	require.Equal(t, 3, count(evs, "running"))
	require.Equal(t, 2, count(evs, "retrying"))
	for _, e := range evs {
		require.Equal(t, e.name, e.job["status"])
		require.Equal(t, id, e.job["id"])
	}
	last := evs[len(evs)-1]
	require.Equal(t, "succeeded", last.name)
	require.Equal(t, "message", last.job["result"].(map[string]any)["type"])
	require.EqualValues(t, 3, last.job["attempts"])
	for _, e := range evs {
		if e.name == "retrying" {
			require.EqualValues(t, 503, e.job["last_error"].(map[string]any)["status"])
		}
	}
}

func TestEvents_RetriedJobStreamsEveryTransition(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{noWorker: true, sim: llmsim.Config{Faults: llmsim.Faults{FailNext: 2, FailNextStatus: 503}}})
	id := b.submit(t, anthropicBody("stream me"))

	s := openEvents(t, b.apiURL, id, "")
	first, ok := s.next(t)
	require.True(t, ok)
	require.Equal(t, "queued/1", eventNames([]sseEvent{first})[0])
	b.startWorker(t)
	b.requireRetriedTwiceThenSucceeded(t, id, append([]sseEvent{first}, s.rest(t)...))
	require.Equal(t, 2, b.sim.Stats().ByStatus[503])
}

func TestEvents_ReconnectGetsExactlyTheMissingEvents(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{noWorker: true, sim: llmsim.Config{Faults: llmsim.Faults{FailNext: 2, FailNextStatus: 503}}})
	id := b.submit(t, anthropicBody("reconnect"))

	s := openEvents(t, b.apiURL, id, "")
	b.startWorker(t)
	var got []sseEvent
	for range 3 {
		ev, ok := s.next(t)
		require.True(t, ok)
		got = append(got, ev)
	}
	s.close() // the connection drops mid-way

	again := openEvents(t, b.apiURL, id, got[2].id)
	got = append(got, again.rest(t)...)
	b.requireRetriedTwiceThenSucceeded(t, id, got)
}

func TestEvents_TwoReplicasStreamTheSameJob(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{noWorker: true, sim: llmsim.Config{Faults: llmsim.Faults{FailNext: 2, FailNextStatus: 503}}})
	other := b.replica(t)
	id := b.submit(t, anthropicBody("two replicas"))

	sa := openEvents(t, b.apiURL, id, "")
	sb := openEvents(t, other, id, "")
	for _, s := range []*eventStream{sa, sb} {
		ev, ok := s.next(t)
		require.True(t, ok)
		require.Equal(t, "queued", ev.name)
	}
	b.startWorker(t)
	restA, restB := sa.rest(t), sb.rest(t)
	require.Equal(t, eventNames(restA), eventNames(restB))
	require.Equal(t, b.storedEvents(t, id)[1:], eventNames(restA))
	require.Equal(t, "succeeded", restB[len(restB)-1].name)
}

func TestEvents_FinishedJobGetsItsTerminalEventAtOnce(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	id := b.submit(t, anthropicBody("done already"))
	b.waitTerminal(t, id)

	evs := openEvents(t, b.apiURL, id, "").rest(t)
	require.Len(t, evs, 1)
	require.Equal(t, "succeeded", evs[0].name)
	require.NotNil(t, evs[0].job["result"])
}
