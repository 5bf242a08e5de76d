package e2e_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/llmsim"
	"github.com/llmq/llmq/internal/redistest"
)

// followJS follows EVENTS_URL with the npm eventsource package and prints one JSON line per
// event, status, delta and reset alike, then "closed" when the stream has ended for good.
const followJS = `
import { EventSource } from 'eventsource'
const es = new EventSource(process.env.EVENTS_URL)
const terminal = ['succeeded', 'failed', 'dead', 'canceled']
for (const name of ['queued', 'running', 'retrying', 'delta', 'reset', ...terminal])
  es.addEventListener(name, (e) => {
    console.log(JSON.stringify({ name, id: e.lastEventId, data: JSON.parse(e.data) }))
    if (terminal.includes(name)) { es.close(); console.log('"closed"') }
  })
`

// jsEvent is one line printed by followJS.
type jsEvent struct {
	Name string         `json:"name"`
	ID   string         `json:"id"`
	Data map[string]any `json:"data"`
}

// followWithEventSource starts followJS on url and returns its events as they come; the channel
// closes when the program printed "closed" or ended. The program is killed at the test's end.
func followWithEventSource(t *testing.T, url string) <-chan jsEvent {
	t.Helper()
	script, err := filepath.Abs(filepath.Join(repoRoot, "scripts", "js.sh"))
	require.NoError(t, err)
	runJS(t, 5*time.Minute, nil, script) // npm ci when stale
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	cmd := exec.CommandContext(ctx, "node", "--input-type=module", "--eval", followJS)
	cmd.Dir, cmd.Env = filepath.Join(repoRoot, "test", "js"), append(os.Environ(), "EVENTS_URL="+url)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 5 * time.Second
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	events := make(chan jsEvent, 1024)
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer close(events)
		lines := bufio.NewScanner(out)
		lines.Buffer(make([]byte, 64<<10), 1<<20)
		for lines.Scan() {
			if lines.Text() == `"closed"` {
				return
			}
			var ev jsEvent
			if json.Unmarshal(lines.Bytes(), &ev) == nil {
				events <- ev
			}
		}
	}()
	t.Cleanup(func() {
		cancel()
		<-done
		_ = cmd.Wait()
	})
	return events
}

// nextJS returns the next event, failing the test after 30s or when the stream ended.
func nextJS(t *testing.T, events <-chan jsEvent) jsEvent {
	t.Helper()
	return nextJSWithin(t, events, 30*time.Second)
}

// nextJSWithin returns the next event, failing the test after d or when the stream ended.
func nextJSWithin(t *testing.T, events <-chan jsEvent, d time.Duration) jsEvent {
	t.Helper()
	select {
	case ev, ok := <-events:
		require.True(t, ok, "the EventSource stream ended early")
		return ev
	case <-time.After(d):
		t.Fatalf("no event from the EventSource within %v", d)
	}
	return jsEvent{}
}

// TestStream_DeltasResetRetryAndResume submits a streaming job whose first attempt fails part
// way (an overloaded_error event after 5 tokens) and follows it with the npm eventsource
// package: the client sees the first attempt's deltas, a reset, the retry's deltas and the
// terminal event with the stored result, which is the retry's message alone. Then a client
// resuming with Last-Event-ID inside an attempt gets exactly the events after it.
func TestStream_DeltasResetRetryAndResume(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{noWorker: true, sim: llmsim.Config{ReplyTokens: 30, StreamTokensPerSecond: 1000,
		Faults: llmsim.Faults{StreamFailNext: 1, StreamFailAfter: 5}}})
	id := b.submit(t, `{"request":{"model":"m","max_tokens":64,"stream":true,"messages":[{"role":"user","content":"Stream to me"}]}}`)
	unlinkDeltasAtEnd(t, b.redisURL, id)
	job := b.do(t, http.MethodGet, "/v1/jobs/"+id, "", nil)
	events := followWithEventSource(t, b.apiURL+job.body["events_url"].(string))
	require.Equal(t, "queued", nextJS(t, events).Name, "the client follows the job before it runs")
	b.startWorker(t)

	var got []jsEvent
	for {
		ev := nextJS(t, events)
		got = append(got, ev)
		if ev.Name == "succeeded" {
			break
		}
	}
	// queued 1, running 2, deltas 2.1..., reset, retrying 3, running 4, deltas 4.1..., succeeded 5.
	var shape []string
	texts := map[string]string{} // by attempt running event
	for i, ev := range got {
		if ev.Name != "delta" || got[i-1].Name != "delta" {
			shape = append(shape, ev.Name)
		}
		if ev.Name == "delta" {
			seq, n, ok := strings.Cut(ev.ID, ".")
			require.True(t, ok, "a delta's id is seq.n: %q", ev.ID)
			require.Equal(t, float64(len(texts[seq])), ev.Data["offset"], "offsets follow each other: no gap, no duplicate")
			texts[seq] += ev.Data["text"].(string)
			require.NotEmpty(t, n)
		}
	}
	require.Equal(t, []string{"running", "delta", "reset", "retrying", "running", "delta", "succeeded"}, shape)
	requireIncreasingIDs(t, got)
	require.Equal(t, "2."+strconv.Itoa(countNamed(got, "delta", "2.")+1), got[indexOf(got, "reset")].ID, "the reset closes attempt 1")

	result := got[len(got)-1].Data["result"].(map[string]any)
	text := result["content"].([]any)[0].(map[string]any)["text"].(string)
	require.Equal(t, text, texts["4"], "the retry's deltas add up to the stored result")
	require.Equal(t, text[:20], texts["2"], "attempt 1 streamed 5 tokens before it failed")
	stored := b.do(t, http.MethodGet, "/v1/jobs/"+id, "", nil).body
	require.Equal(t, result, stored["result"], "the terminal event carries the stored result")
	require.Equal(t, float64(2), stored["attempts"])
	require.Equal(t, "end_turn", result["stop_reason"])

	// Resume inside the second attempt, after its second delta: exactly the rest follows.
	at := indexOfID(got, "4.2")
	require.Positive(t, at, "attempt 2 sent at least 2 deltas")
	rest := openEvents(t, b.apiURL, id, "4.2").rest(t)
	require.Equal(t, idsOf(got[at+1:]), eventNames(rest))
	// And inside the first: the rest of it, its reset, the retry, to the end.
	rest = openEvents(t, b.apiURL, id, "2.1").rest(t)
	require.Equal(t, idsOf(got[indexOfID(got, "2.1")+1:]), eventNames(rest))
	// After the terminal event: nothing more.
	req, err := http.NewRequestWithContext(b.ctx, http.MethodGet, b.apiURL+"/v1/jobs/"+id+"/events", nil)
	require.NoError(t, err)
	req.Header.Set("Last-Event-ID", "5")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusNoContent, resp.StatusCode)
}

func requireIncreasingIDs(t *testing.T, evs []jsEvent) {
	t.Helper()
	prev := [2]int{}
	for _, ev := range evs {
		seqText, nText, _ := strings.Cut(ev.ID, ".")
		seq, err := strconv.Atoi(seqText)
		require.NoError(t, err)
		n := 0
		if nText != "" {
			n, err = strconv.Atoi(nText)
			require.NoError(t, err)
		}
		cur := [2]int{seq, n}
		require.True(t, cur[0] > prev[0] || cur[0] == prev[0] && cur[1] > prev[1], "ids increase: %v after %v", cur, prev)
		prev = cur
	}
}

func countNamed(evs []jsEvent, name, idPrefix string) int {
	n := 0
	for _, ev := range evs {
		if ev.Name == name && strings.HasPrefix(ev.ID, idPrefix) {
			n++
		}
	}
	return n
}

func indexOf(evs []jsEvent, name string) int {
	for i, ev := range evs {
		if ev.Name == name {
			return i
		}
	}
	return -1
}

func indexOfID(evs []jsEvent, id string) int {
	for i, ev := range evs {
		if ev.ID == id {
			return i
		}
	}
	return -1
}

func idsOf(evs []jsEvent) []string {
	out := make([]string, len(evs))
	for i, ev := range evs {
		out[i] = fmt.Sprintf("%s/%s", ev.Name, ev.ID)
	}
	return out
}

// TestStream_CancelStopsTheStreamingCall proves that DELETE stops a streaming call: the
// provider's stream (18,000 tokens at 5 per second, an hour) is abandoned after its first
// deltas, the job ends canceled without a result, and the client's stream ends with the
// canceled event.
func TestStream_CancelStopsTheStreamingCall(t *testing.T) {
	t.Parallel()
	// The stream lasts an hour and the attempt's lease is renewed once an hour (a renewal that
	// finds the job canceled stops the call too): only the cancel ends the call within the
	// test's deadline.
	b := setup(t, setupOpts{sim: llmsim.Config{ReplyTokens: 18000, StreamTokensPerSecond: 5}, leaseRenewal: time.Hour})
	id := b.submit(t, `{"request":{"model":"m","max_tokens":18000,"stream":true,"messages":[{"role":"user","content":"slowly"}]}}`)
	unlinkDeltasAtEnd(t, b.redisURL, id)
	s := openEvents(t, b.apiURL, id, "0")
	for {
		ev, ok := s.next(t)
		require.True(t, ok)
		if ev.name == "delta" {
			break
		}
	}
	r := b.do(t, http.MethodDelete, "/v1/jobs/"+id, "", nil)
	require.Equal(t, http.StatusOK, r.status, "body %v", r.body)
	require.Eventually(t, func() bool { return b.sim.Stats().InFlight == 0 }, 30*time.Second, time.Millisecond,
		"the provider's stream is abandoned")

	rest := s.rest(t)
	last := rest[len(rest)-1]
	require.Equal(t, "canceled", last.name)
	require.Nil(t, last.job["result"])
	require.Equal(t, 0, count(rest, "reset"), "a canceled job is not retried: nothing to reset")
	require.Equal(t, "canceled", b.waitTerminal(t, id)["status"])
}

// TestStream_TwoReplicasGetEveryDelta proves that deltas reach whichever API replica holds a
// client's stream, in order and whole, on Redis and on Redis Cluster: two replicas follow one
// streaming job (20 tokens at 200 per second, so the streams are open while it streams) and
// both see the same events, whose deltas add up to the stored result.
func TestStream_TwoReplicasGetEveryDelta(t *testing.T) {
	t.Parallel()
	for name, url := range map[string]string{"Redis": redistest.URL(), "Cluster": redistest.ClusterURL()} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, setupOpts{noWorker: true, redisURL: url, sim: llmsim.Config{ReplyTokens: 20, StreamTokensPerSecond: 200}})
			other := b.replica(t)
			id := b.submit(t, `{"request":{"model":"m","max_tokens":64,"stream":true,"messages":[{"role":"user","content":"to both"}]}}`)
			unlinkDeltasAtEnd(t, url, id)
			sa, sb := openEvents(t, b.apiURL, id, ""), openEvents(t, other, id, "")
			for _, s := range []*eventStream{sa, sb} {
				ev, ok := s.next(t)
				require.True(t, ok)
				require.Equal(t, "queued", ev.name)
			}
			b.startWorker(t)
			restA, restB := sa.rest(t), sb.rest(t)
			require.Equal(t, eventNames(restA), eventNames(restB))
			require.Positive(t, count(restA, "delta"))
			requireStreamedResult(t, restA)
		})
	}
}

// requireStreamedResult checks that evs (a stream's events after its first) end with the job's
// success, and that their deltas, each at the offset the ones before it reached, add up to the
// stored result's text.
func requireStreamedResult(t *testing.T, evs []sseEvent) {
	t.Helper()
	var text string
	for _, ev := range evs {
		if ev.name == "delta" {
			require.Equal(t, float64(len(text)), ev.job["offset"])
			text += ev.job["text"].(string)
		}
	}
	last := evs[len(evs)-1]
	require.Equal(t, "succeeded", last.name)
	result := last.job["result"].(map[string]any)
	require.Equal(t, result["content"].([]any)[0].(map[string]any)["text"], text)
}

// TestStream_DeltaSpacingMergesPieces proves that streaming.delta_spacing reaches the worker:
// with a spacing far longer than the whole stream (20 tokens at 400 per second), the attempt's
// first piece goes at once and the rest waits for the attempt's end, so the client gets two
// delta events (one per token without it; a third only if the stream outlasted the spacing on a
// stalled machine) that still add up to the stored result.
func TestStream_DeltaSpacingMergesPieces(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{top: "streaming: { delta_spacing: 1s }", sim: llmsim.Config{ReplyTokens: 20, StreamTokensPerSecond: 400}})
	id := b.submit(t, `{"request":{"model":"m","max_tokens":64,"stream":true,"messages":[{"role":"user","content":"spaced"}]}}`)
	unlinkDeltasAtEnd(t, b.redisURL, id)
	evs := openEvents(t, b.apiURL, id, "0").rest(t)
	requireStreamedResult(t, evs)
	n := count(evs, "delta")
	require.True(t, n == 2 || n == 3, "the first piece, then the rest at the attempt's end: %v", eventNames(evs))
}

// TestStream_WholeToolInputReachesClients proves that a tool call whose input a server sends
// whole (llmsim's StreamToolInputWhole: an Anthropic-compatible server's input in
// content_block_start, an OpenAI-compatible server's arguments in the call's first chunk)
// reaches clients: the stream's input_json deltas open the call with its id and name and add up
// to the stored call's input.
func TestStream_WholeToolInputReachesClients(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{sim: llmsim.Config{StreamToolInputWhole: true}})
	for name, tc := range map[string]struct {
		submit string
		input  func(result map[string]any) (id, input string)
	}{
		"Anthropic": {
			submit: `{"request":{"model":"m","max_tokens":64,"stream":true,"tools":[{"name":"echo","input_schema":{"type":"object"}}],"messages":[{"role":"user","content":"call it"}]}}`,
			input: func(result map[string]any) (string, string) {
				call := result["content"].([]any)[1].(map[string]any)
				input, err := json.Marshal(call["input"])
				require.NoError(t, err)
				return call["id"].(string), string(input)
			},
		},
		"OpenAI": {
			submit: `{"credential":"oai","request":{"model":"m","stream":true,"tools":[{"type":"function","function":{"name":"echo","parameters":{"type":"object"}}}],"messages":[{"role":"user","content":"call it"}]}}`,
			input: func(result map[string]any) (string, string) {
				msg := result["choices"].([]any)[0].(map[string]any)["message"].(map[string]any)
				call := msg["tool_calls"].([]any)[0].(map[string]any)
				return call["id"].(string), call["function"].(map[string]any)["arguments"].(string)
			},
		},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			id := b.submit(t, tc.submit)
			unlinkDeltasAtEnd(t, b.redisURL, id)
			evs := openEvents(t, b.apiURL, id, "0").rest(t)
			last := evs[len(evs)-1]
			require.Equal(t, "succeeded", last.name)
			callID, want := tc.input(last.job["result"].(map[string]any))
			var got, opened string
			for _, ev := range evs {
				if ev.name != "delta" || ev.job["type"] != "input_json" {
					continue
				}
				if tid, _ := ev.job["tool_id"].(string); tid != "" {
					require.Empty(t, got, "the call is opened before its input")
					opened = tid
				}
				got += ev.job["text"].(string)
			}
			require.Equal(t, callID, opened)
			require.NotEmpty(t, want)
			require.JSONEq(t, want, got, "the input_json deltas add up to the stored input")
		})
	}
}

// TestStream_ToolCallsAtOneIndexReachClientsApart proves that parallel tool calls a server
// streams all at index 0, each whole with its own id (llmsim's StreamToolCallsAtIndexZero, as
// Ollama sends them), reach the event stream's clients as the stored message has them: each
// call's input_json deltas under a tool_index of its own, its position in the stored calls,
// opened with its id and adding up to its arguments.
func TestStream_ToolCallsAtOneIndexReachClientsApart(t *testing.T) {
	t.Parallel()
	requireToolCallsAtTheirPlaces(t, llmsim.Config{ToolCalls: 2, StreamToolCallsAtIndexZero: true})
}

// TestStream_ToolCallsFromIndexOneReachClientsAtTheirPlaces proves that tool calls a server
// numbers from 1 (llmsim's StreamToolCallsFromIndex, as proxies that number calls by Anthropic's
// content blocks send them) reach the event stream's clients under the tool_index of their
// position in the stored calls, which start at the first: 0 and 1, not 1 and 2.
func TestStream_ToolCallsFromIndexOneReachClientsAtTheirPlaces(t *testing.T) {
	t.Parallel()
	requireToolCallsAtTheirPlaces(t, llmsim.Config{ToolCalls: 2, StreamToolCallsFromIndex: 1})
}

// TestStream_ToolNamesApartFromArgumentsReachClientsAsOneCallEach proves that calls a server sends
// with the name at its tool's index and the arguments at the call's own, every piece under an id
// of its own (llmsim's StreamToolNamesAtIndex, as SGLang 0.4.6 sent them), are stored as one call
// each with its name and arguments, and reach the event stream's clients under one tool_index
// each, whose deltas add up to the stored arguments.
func TestStream_ToolNamesApartFromArgumentsReachClientsAsOneCallEach(t *testing.T) {
	t.Parallel()
	calls, evs := streamedToolCallsJob(t, llmsim.Config{ToolCalls: 2, StreamToolNamesAtIndex: 1})
	input := map[int]string{}
	for _, ev := range inputJSONDeltas(evs) {
		input[ev.index] += ev.text
	}
	require.Len(t, input, 2, "the deltas of two calls, under a tool_index each")
	for i, c := range calls {
		fn := c.(map[string]any)["function"].(map[string]any)
		require.Equal(t, "echo", fn["name"], "call %d", i)
		args := fn["arguments"].(string)
		require.NotEmpty(t, args, "call %d has its arguments", i)
		require.JSONEq(t, args, input[i], "the deltas of tool_index %d add up to its arguments", i)
	}
}

// requireToolCallsAtTheirPlaces submits a streamed job with a tool to the simulator configured
// with sim (two calls), and requires each stored call's input_json deltas on the event stream
// under the tool_index of its position in the stored calls, opened with its id and adding up to
// its arguments.
func requireToolCallsAtTheirPlaces(t *testing.T, sim llmsim.Config) {
	t.Helper()
	calls, evs := streamedToolCallsJob(t, sim)
	opened, input := map[int]string{}, map[int]string{}
	for _, ev := range inputJSONDeltas(evs) {
		if ev.id != "" {
			require.Empty(t, opened[ev.index], "one id per tool index")
			opened[ev.index] = ev.id
		}
		input[ev.index] += ev.text
	}
	require.Len(t, opened, 2)
	for i, c := range calls {
		call := c.(map[string]any)
		require.Equal(t, call["id"], opened[i], "call %d under tool_index %d", i, i)
		args := call["function"].(map[string]any)["arguments"].(string)
		require.JSONEq(t, args, input[i], "the deltas of tool_index %d add up to its arguments", i)
	}
	require.NotEqual(t, opened[0], opened[1])
}

// streamedToolCallsJob submits a streamed job with a tool to the simulator configured with sim
// (two calls), reads its event stream to the end, and returns the stored message's two tool calls
// and the stream's events.
func streamedToolCallsJob(t *testing.T, sim llmsim.Config) (calls []any, evs []sseEvent) {
	t.Helper()
	b := setup(t, setupOpts{sim: sim})
	id := b.submit(t, `{"credential":"oai","request":{"model":"m","stream":true,"tools":[{"type":"function","function":{"name":"echo","parameters":{"type":"object"}}}],"messages":[{"role":"user","content":"call it twice"}]}}`)
	unlinkDeltasAtEnd(t, b.redisURL, id)
	evs = openEvents(t, b.apiURL, id, "0").rest(t)
	last := evs[len(evs)-1]
	require.Equal(t, "succeeded", last.name)
	msg := last.job["result"].(map[string]any)["choices"].([]any)[0].(map[string]any)["message"].(map[string]any)
	calls, _ = msg["tool_calls"].([]any)
	require.Len(t, calls, 2, "two calls, each with its name and arguments: %v", calls)
	return calls, evs
}

// inputJSONDelta is an input_json delta of an event stream: its tool_index (0 when left out), the
// tool_id it opened its call with (if it did) and its text.
type inputJSONDelta struct {
	index    int
	id, text string
}

// inputJSONDeltas returns the input_json deltas among evs, in order.
func inputJSONDeltas(evs []sseEvent) []inputJSONDelta {
	var ds []inputJSONDelta
	for _, ev := range evs {
		if ev.name != "delta" || ev.job["type"] != "input_json" {
			continue
		}
		d := inputJSONDelta{}
		if v, ok := ev.job["tool_index"].(float64); ok {
			d.index = int(v)
		}
		d.id, _ = ev.job["tool_id"].(string)
		d.text, _ = ev.job["text"].(string)
		ds = append(ds, d)
	}
	return ds
}

// unlinkDeltasAtEnd removes job id's delta buffer from the Redis at redisURL when the test ends:
// the buffer expires by itself, but a test leaves nothing behind meanwhile.
func unlinkDeltasAtEnd(t *testing.T, redisURL, id string) {
	t.Helper()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		redistest.Unlink(ctx, redistest.ClientOf(t, redisURL), "llmq:{"+id+"}:deltas")
	})
}
