package executor_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/dispatch"
	"github.com/llmq/llmq/internal/executor"
	"github.com/llmq/llmq/internal/jobs"
	"github.com/llmq/llmq/internal/jobstest"
	"github.com/llmq/llmq/internal/llm"
	"github.com/llmq/llmq/internal/llmsim"
)

// storedUsage is a usage as stored on a job or an attempt: its JSON members, decoded loosely, so
// that a member's absence shows.
type storedUsage struct {
	InputTokens      *int  `json:"input_tokens"`
	OutputTokens     *int  `json:"output_tokens"`
	OutputUnreported *bool `json:"output_unreported"`
}

func decodeStoredUsage(t *testing.T, raw json.RawMessage) storedUsage {
	t.Helper()
	require.NotNil(t, raw, "no usage stored")
	var u storedUsage
	require.NoError(t, json.Unmarshal(raw, &u), "%s", raw)
	return u
}

// An answer whose usage reported the input but no output count (a gateway's partial usage, or
// an Anthropic stream whose output was never reported after message_start) was stored as
// output_tokens 0, which reads as an empty answer: a client could not tell it from a reported 0.
// The stored usage says the output was not reported (output_unreported), on the job and its
// attempt alike; a usage that reported its output carries no such member.
func TestExecutor_StoredUsageSaysOutputUnreported(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name       string
		deltaUsage string // the stream's message_delta usage ("": none)
		stream     bool
		unreported bool
	}{
		{"StreamDeltaWithoutUsage", "", true, true},
		{"StreamDeltaUsageWithoutOutput", `{"input_tokens":500}`, true, true},
		{"StreamDeltaWithOutput", `{"output_tokens":3}`, true, false},
		{"StreamDeltaWithZeroOutput", `{"output_tokens":0}`, true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := t.Context()
			b := jobstest.New(t)
			srv := httptest.NewServer(answerWithDeltaUsage(`{"input_tokens":500,"output_tokens":1}`, tc.deltaUsage))
			t.Cleanup(srv.Close)
			p, err := llm.New(llm.Config{Kind: llm.KindAnthropic, BaseURL: srv.URL, APIKey: "sk-unreported"})
			require.NoError(t, err)
			ex := executor.New(executor.Config{Store: b.Store,
				Upstreams: map[string]executor.Upstream{"gw": {Name: "gw", Kind: string(llm.KindAnthropic), Provider: p}}})
			body := json.RawMessage(`{"model":"claude-test","max_tokens":16,"stream":true,"messages":[{"role":"user","content":"hi"}]}`)
			job, _, err := b.Store.Create(ctx, jobs.CreateParams{Tenant: "default", Credential: "gw", Request: body,
				MaxAttempts: 1, Timeout: time.Minute})
			require.NoError(t, err)
			require.NoError(t, ex.Process(ctx, dispatch.Delivery{JobID: job.ID}))
			got, err := b.Store.Get(ctx, job.ID)
			require.NoError(t, err)
			require.Equal(t, jobs.StatusSucceeded, got.Status, "%+v", got.LastError)

			u := decodeStoredUsage(t, got.Usage)
			require.NotNil(t, u.InputTokens, "%s", got.Usage)
			require.Equal(t, 500, *u.InputTokens)
			require.NotNil(t, u.OutputTokens, "output_tokens stays an integer: %s", got.Usage)
			if tc.unreported {
				require.Zero(t, *u.OutputTokens, "%s", got.Usage)
				require.NotNil(t, u.OutputUnreported, "a usage without its output count reads as 0 output tokens: %s", got.Usage)
				require.True(t, *u.OutputUnreported, "%s", got.Usage)
			} else {
				require.Nil(t, u.OutputUnreported, "a reported output is marked: %s", got.Usage)
			}
			attempts, err := b.Store.Attempts(ctx, job.ID)
			require.NoError(t, err)
			require.Len(t, attempts, 1)
			require.JSONEq(t, string(got.Usage), string(attempts[0].Usage))
		})
	}
}

// A stream ended by an Anthropic error event before any message_delta (right after message_start,
// or after some text) reported the prompt's input tokens and nothing real of its output:
// message_start's output_tokens is a placeholder (1) written before any output. The failed
// attempt's row said output_tokens 1 all the same, a count the provider never gave (and too low
// when text had come). It keeps the input and says the output was not reported.
func TestExecutor_FailedStreamAttemptOmitsThePlaceholderOutput(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		mode  string
		after int
	}{
		{"ErrorRightAfterMessageStart", llmsim.StreamFailError, 0},
		{"ErrorAfterText", llmsim.StreamFailError, 2},
		{"CutAfterText", llmsim.StreamFailCut, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			a, _ := failedStreamAttempt(t, llm.KindAnthropic, llmsim.Faults{StreamFailNext: 1, StreamFailAfter: tc.after, StreamFailMode: tc.mode})
			u := decodeStoredUsage(t, a.Usage)
			require.NotNil(t, u.InputTokens, "%s", a.Usage)
			require.Positive(t, *u.InputTokens, "%s", a.Usage)
			require.NotNil(t, u.OutputTokens, "%s", a.Usage)
			require.Zero(t, *u.OutputTokens, "the failed attempt's row reports message_start's placeholder output: %s", a.Usage)
			require.NotNil(t, u.OutputUnreported, "%s", a.Usage)
			require.True(t, *u.OutputUnreported, "%s", a.Usage)
		})
	}
}

// An OpenAI stream that fails before its usage chunk (the last one) reported no usage: the
// prompt was sent and output came, but the provider gave no count of either, and none is made up
// (docs/decisions.md, "A failed attempt's row says what its provider reported, and no more"): the
// attempt's usage stays null. What shows that the provider had started answering is the row's
// ttfb_ms, the time to the first delta: a cut stream's row had none (a mid-stream error event's
// had it), so a stream cut after its output began read as one that never began.
func TestExecutor_OpenAIStreamFailedBeforeItsUsageRecordsNoUsage(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{llmsim.StreamFailError, llmsim.StreamFailCut} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			a, _ := failedStreamAttempt(t, llm.KindOpenAI, llmsim.Faults{StreamFailNext: 1, StreamFailAfter: 2, StreamFailMode: mode})
			require.Nil(t, a.Usage, "a usage the provider never reported: %s", a.Usage)
			require.NotNil(t, a.TTFBMS, "the row does not show that the stream had begun")
			require.Positive(t, *a.TTFBMS)
			require.LessOrEqual(t, *a.TTFBMS, a.LatencyMS)
		})
	}
}

// A job canceled while its stream is under way (after message_start and some text) ends without
// an answer: its usage stays null, as any job's that ended without one (the job's usage is its
// answer's: docs/decisions.md, "A failed attempt's row keeps its partial usage; the job's usage
// stays its answer's"), and its attempt's row holds what the provider reported: the input, the
// output unreported (message_start's placeholder is no count).
func TestExecutor_CanceledMidStreamKeepsItsCostOnTheAttempt(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := jobstest.New(t)
	started := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		ev := func(name, data string) { _, _ = fmt.Fprintf(w, "event: %s\ndata: %s\n\n", name, data) }
		ev("message_start", `{"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant",`+
			`"model":"claude-test","content":[],"stop_reason":null,"usage":{"input_tokens":500,"output_tokens":1}}}`)
		ev("content_block_start", `{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}`)
		ev("content_block_delta", `{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"partial"}}`)
		w.(http.Flusher).Flush()
		close(started)
		<-r.Context().Done() // the rest never comes: the cancel's abort ends the call
	}))
	t.Cleanup(srv.Close)
	p, err := llm.New(llm.Config{Kind: llm.KindAnthropic, BaseURL: srv.URL, APIKey: "sk-cancel"})
	require.NoError(t, err)
	ex := executor.New(executor.Config{Store: b.Store,
		Upstreams: map[string]executor.Upstream{"c": {Name: "c", Kind: string(llm.KindAnthropic), Provider: p}}})
	body := json.RawMessage(`{"model":"claude-test","max_tokens":16,"stream":true,"messages":[{"role":"user","content":"hi"}]}`)
	job, _, err := b.Store.Create(ctx, jobs.CreateParams{Tenant: "default", Credential: "c", Request: body,
		MaxAttempts: 2, Timeout: time.Minute})
	require.NoError(t, err)

	pctx, abort := context.WithCancel(ctx)
	defer abort()
	done := make(chan error, 1)
	go func() { done <- ex.Process(pctx, dispatch.Delivery{JobID: job.ID}) }()
	select {
	case <-started:
	case <-time.After(30 * time.Second):
		t.Fatal("the stream did not start")
	}
	_, err = b.Store.Cancel(ctx, job.ID)
	require.NoError(t, err)
	abort() // what the cancel's abort of the task does (dispatch.Tasks.AbortEnded)
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("the delivery did not end after the abort")
	}

	got, err := b.Store.Get(ctx, job.ID)
	require.NoError(t, err)
	require.Equal(t, jobs.StatusCanceled, got.Status)
	require.Nil(t, got.Usage, "a partial usage became the canceled job's: %s", got.Usage)
	attempts, err := b.Store.Attempts(ctx, job.ID)
	require.NoError(t, err)
	require.Len(t, attempts, 1)
	require.JSONEq(t, `{"input_tokens":500,"output_tokens":0,"output_unreported":true}`, string(attempts[0].Usage))
	require.NotNil(t, attempts[0].TTFBMS, "the attempt does not show its stream had begun")
}
