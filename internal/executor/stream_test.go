package executor_test

import (
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/deltastream"
	"github.com/llmq/llmq/internal/dispatch"
	"github.com/llmq/llmq/internal/executor"
	"github.com/llmq/llmq/internal/jobs"
	"github.com/llmq/llmq/internal/jobstest"
	"github.com/llmq/llmq/internal/llm"
	"github.com/llmq/llmq/internal/llmsim"
	"github.com/llmq/llmq/internal/redistest"
	"github.com/llmq/llmq/internal/retrypolicy"
)

// TestExecutor_StreamingJob proves what a streaming job's deliveries leave behind: the first
// attempt fails after 3 tokens (an overloaded_error event) and is retried; the job's buffer holds
// that attempt's deltas, then its reset, then the retry's deltas, all written before each outcome
// was recorded; Postgres holds one result, the retry's assembled message, with its usage.
func TestExecutor_StreamingJob(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := jobstest.New(t)
	rdb := redistest.Client(t)
	buf := deltastream.New(deltastream.Config{Redis: rdb, Prefix: redistest.Prefix(t)})
	p := simProvider(t, llmsim.Config{ReplyTokens: 12, Faults: llmsim.Faults{StreamFailNext: 1, StreamFailAfter: 3}}, "sk-stream")
	ex := executor.New(executor.Config{Store: b.Store, Deltas: buf,
		Policy:    retrypolicy.New(&retrypolicy.Config{BaseDelay: time.Millisecond, MaxDelay: 2 * time.Millisecond}),
		Upstreams: map[string]executor.Upstream{"default": {Name: "default", Kind: string(llm.KindAnthropic), Provider: p}}})
	job, _, err := b.Store.Create(ctx, jobs.CreateParams{Tenant: "default", Credential: "default",
		Request:     json.RawMessage(`{"model":"m","max_tokens":64,"stream":true,"messages":[{"role":"user","content":"hi"}]}`),
		MaxAttempts: 3, Timeout: time.Minute})
	require.NoError(t, err)

	var deferred *dispatch.DeferError
	require.True(t, errors.As(ex.Process(ctx, dispatch.Delivery{JobID: job.ID}), &deferred), "attempt 1 is retried")
	mid, err := buf.Read(ctx, job.ID, "", 100)
	require.NoError(t, err)
	require.NotEmpty(t, mid)
	require.Equal(t, deltastream.KindReset, mid[len(mid)-1].Kind, "the reset is in the buffer once the retry is recorded")
	require.NoError(t, ex.Process(ctx, dispatch.Delivery{JobID: job.ID}))

	got, err := b.Store.Get(ctx, job.ID)
	require.NoError(t, err)
	require.Equal(t, jobs.StatusSucceeded, got.Status)
	require.Equal(t, 2, got.Attempts)
	var result struct {
		Content []struct {
			Text string `json:"text"`
		} `json:"content"`
		StopReason string `json:"stop_reason"`
	}
	require.NoError(t, json.Unmarshal(got.Result, &result))
	require.Equal(t, "end_turn", result.StopReason)
	require.JSONEq(t, `{"input_tokens":1,"output_tokens":12}`, string(got.Usage), "the stream's usage, for the token limiter too")

	entries, err := buf.Read(ctx, job.ID, "", 100)
	require.NoError(t, err)
	texts := map[int]string{}
	var kinds []string
	for _, e := range entries {
		if len(kinds) == 0 || kinds[len(kinds)-1] != e.Kind {
			kinds = append(kinds, e.Kind)
		}
		var d struct {
			Attempt int    `json:"attempt"`
			Text    string `json:"text"`
		}
		require.NoError(t, json.Unmarshal(e.Data, &d))
		texts[d.Attempt] += d.Text
	}
	require.Equal(t, []string{"delta", "reset", "delta"}, kinds)
	require.Equal(t, result.Content[0].Text, texts[2], "the retry's deltas add up to the stored result")
	require.Equal(t, result.Content[0].Text[:12], texts[1], "attempt 1 streamed 3 tokens")
	require.Equal(t, entries[0].Seq+2, entries[len(entries)-1].Seq, "running, retrying, running: the retry's seq")
}
