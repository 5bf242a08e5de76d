package e2e_test

import (
	"context"
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/llmsim"
)

// TestStream_WorkerSIGKILLedMidStream: a streaming job's first attempt runs in a worker process
// that is SIGKILLed once the client (the npm eventsource package) has seen its first delta. The
// dead worker writes no reset; the API sends one itself when the retry's status event arrives,
// so the client sees the first attempt's deltas, a reset closing them, the retry's deltas from
// another worker, and the terminal event, whose result, the stored one, is the retry's message
// alone.
func TestStream_WorkerSIGKILLedMidStream(t *testing.T) {
	t.Parallel()
	bin := buildWorker(t)
	// 40 tokens at 10 a second: an attempt streams for 4 s, so the kill, right after the first
	// delta reached the client, lands in its middle.
	s := newChaosStackSim(t, llmsim.Config{ReplyTokens: 40, StreamTokensPerSecond: 10})
	s.orphanGrace = rescueOrphanGrace
	id := s.submitOne(t, `{"request":{"model":"m","max_tokens":64,"stream":true,"messages":[{"role":"user","content":"Stream, then die"}]}}`)
	events := followWithEventSource(t, s.apiURL+"/v1/jobs/"+id+"/events")
	require.Equal(t, "queued", nextJS(t, events).Name, "the client follows the job before it runs")

	proc := s.startWorkerProcess(t, bin)
	var got []jsEvent
	for len(got) == 0 || got[len(got)-1].Name != "delta" {
		got = append(got, nextJS(t, events)) // each within 30 s
	}
	require.NoError(t, proc.Signal(syscall.SIGKILL))
	// The other worker rescues the orphan and runs the retry: once the dead process's asynq
	// server entry expired (10 s), the attempt lease (15 s) is over and the task has looked
	// orphaned for rescueOrphanGrace (8 s) since, so the next event may take 25 s.
	s.startWorker(t, nil, 0)
	for ev := got[len(got)-1]; ev.Name != "succeeded"; {
		ev = nextJSWithin(t, events, 60*time.Second)
		require.NotContains(t, []string{"failed", "dead", "canceled"}, ev.Name)
		got = append(got, ev)
	}

	var shape []string
	texts := map[string]string{} // deltas' text by attempt (their running event's seq)
	var seqs []string            // those seqs, in order
	for i, ev := range got {
		if ev.Name != "delta" || got[i-1].Name != "delta" {
			shape = append(shape, ev.Name)
		}
		if ev.Name != "delta" {
			continue
		}
		seq, _, ok := strings.Cut(ev.ID, ".")
		require.True(t, ok, "a delta's id is seq.n: %q", ev.ID)
		if _, seen := texts[seq]; !seen {
			seqs = append(seqs, seq)
		}
		require.Equal(t, float64(len(texts[seq])), ev.Data["offset"], "offsets follow each other: no gap, no duplicate")
		texts[seq] += ev.Data["text"].(string)
	}
	require.Equal(t, []string{"running", "delta", "reset", "running", "delta", "succeeded"}, shape,
		"the rescued job runs again: no retrying event, as no attempt failed in the worker's eyes")
	require.Len(t, seqs, 2, "two attempts streamed")
	reset := indexOf(got, "reset")
	require.Positive(t, reset, "the client saw a reset")
	require.Equal(t, "delta", got[reset-1].Name, "the reset follows the killed attempt's deltas")
	require.Equal(t, seqs[0]+"."+strconv.Itoa(countNamed(got, "delta", seqs[0]+".")+1), got[reset].ID,
		"the reset closes the killed attempt, with the id its entry would have had")
	require.Equal(t, float64(1), got[reset].Data["attempt"])
	require.Equal(t, 1, countNamed(got, "reset", ""), "one reset: the retry is not reset")
	requireIncreasingIDs(t, got)

	result := got[len(got)-1].Data["result"].(map[string]any)
	content := result["content"].([]any)
	require.Len(t, content, 1, "the retry's message alone")
	text := content[0].(map[string]any)["text"].(string)
	require.Equal(t, text, texts[seqs[1]], "the retry's deltas add up to the stored result")
	require.True(t, strings.HasPrefix(text, texts[seqs[0]]), "the killed attempt streamed the same reply's start")
	require.Less(t, len(texts[seqs[0]]), len(text), "the kill landed mid-stream")
	stored := s.getJob(t, id)
	require.Equal(t, "succeeded", stored["status"])
	require.Equal(t, result, stored["result"], "the terminal event carries the stored result")
	require.Equal(t, "end_turn", result["stop_reason"])
	require.Equal(t, float64(2), stored["attempts"], "the killed attempt counts")
	require.Equal(t, 2, s.sim.Stats().Requests, "one call each: the retry was not run twice")
}

// submitOne posts one job and requires 202; it returns the job's ID.
func (s *chaosStack) submitOne(t *testing.T, body string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(s.ctx, 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.apiURL+"/v1/jobs", strings.NewReader(body))
	require.NoError(t, err)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	var job map[string]any
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&job))
	require.Equal(t, http.StatusAccepted, resp.StatusCode, "body: %v", job)
	return job["id"].(string)
}

// getJob returns GET /v1/jobs/{id}.
func (s *chaosStack) getJob(t *testing.T, id string) map[string]any {
	t.Helper()
	ctx, cancel := context.WithTimeout(s.ctx, 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.apiURL+"/v1/jobs/"+id, nil)
	require.NoError(t, err)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	var job map[string]any
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&job))
	return job
}
