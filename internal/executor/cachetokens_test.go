package executor_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/deltastream"
	"github.com/llmq/llmq/internal/dispatch"
	"github.com/llmq/llmq/internal/estimator"
	"github.com/llmq/llmq/internal/executor"
	"github.com/llmq/llmq/internal/jobs"
	"github.com/llmq/llmq/internal/jobstest"
	"github.com/llmq/llmq/internal/limiter"
	"github.com/llmq/llmq/internal/llm"
	"github.com/llmq/llmq/internal/redistest"
	"github.com/llmq/llmq/internal/retrypolicy"
	"github.com/llmq/llmq/internal/tokens"
)

// cachedAnswer answers every call as Anthropic does for a prompt-cached request: usage (in the
// message, or in a stream's message_start and message_delta) reports the uncached input, the
// cache's creation and its read apart.
func cachedAnswer(usage string) http.HandlerFunc {
	return answerWithDeltaUsage(usage, `{"output_tokens":3}`)
}

// answerWithDeltaUsage is cachedAnswer whose stream's message_delta carries deltaUsage ("": no
// usage at all) after message_start's usage.
func answerWithDeltaUsage(usage, deltaUsage string) http.HandlerFunc {
	delta := `{"type":"message_delta","delta":{"stop_reason":"end_turn"}}`
	if deltaUsage != "" {
		delta = `{"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":` + deltaUsage + `}`
	}
	return func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if !strings.Contains(string(body), `"stream":true`) {
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, `{"id":"msg_1","type":"message","role":"assistant","model":"claude-test",`+
				`"content":[{"type":"text","text":"ok"}],"stop_reason":"end_turn","usage":`+usage+`}`)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		ev := func(name, data string) { _, _ = fmt.Fprintf(w, "event: %s\ndata: %s\n\n", name, data) }
		ev("message_start", `{"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant",`+
			`"model":"claude-test","content":[],"stop_reason":null,"usage":`+usage+`}}`)
		ev("content_block_start", `{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}`)
		ev("content_block_delta", `{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"ok"}}`)
		ev("content_block_stop", `{"type":"content_block_stop","index":0}`)
		ev("message_delta", delta)
		ev("message_stop", `{"type":"message_stop"}`)
	}
}

// runCached runs one job (streamed or not, ~2,000 characters of prompt: ~500 tokens by the rule,
// 625 reserved, and 16 output tokens of the minute's 30) against a provider answering usage, and
// returns the gate, its limit and the estimator it reconciled with. The estimator's PriorWeight
// is 1 token: the one answer all but sets the ratio, as the tests read it (runCachedWith).
func runCached(t *testing.T, usage string, stream bool) (*limiter.Gate, limiter.Limit, *estimator.Estimator) {
	t.Helper()
	return runCachedWith(t, usage, stream, &estimator.Config{PriorWeight: 1})
}

// runCachedWith is runCached with an estimator of estCfg (nil: the defaults).
func runCachedWith(t *testing.T, usage string, stream bool, estCfg *estimator.Config) (*limiter.Gate, limiter.Limit, *estimator.Estimator) {
	t.Helper()
	return runAnswered(t, cachedAnswer(usage), stream, estCfg)
}

// runAnswered is runCachedWith against a provider answering as answer does.
func runAnswered(t *testing.T, answer http.HandlerFunc, stream bool, estCfg *estimator.Config) (*limiter.Gate, limiter.Limit, *estimator.Estimator) {
	t.Helper()
	r := runAnsweredJob(t, answer, stream, estCfg)
	return r.gate, r.limit, r.est
}

// answeredRun is what runAnsweredJob ran: the gate, its limit and the estimator, and the
// succeeded job with its attempts as stored.
type answeredRun struct {
	gate     *limiter.Gate
	limit    limiter.Limit
	est      *estimator.Estimator
	job      *jobs.Job
	attempts []jobs.AttemptRow
}

// runAnsweredJob is runAnswered, returning the stored job and its attempts too.
func runAnsweredJob(t *testing.T, answer http.HandlerFunc, stream bool, estCfg *estimator.Config) answeredRun {
	t.Helper()
	req := map[string]any{"model": "claude-test", "max_tokens": 16,
		"system":   []any{map[string]any{"type": "text", "text": strings.Repeat("a", 2000), "cache_control": map[string]any{"type": "ephemeral"}}},
		"messages": []any{map[string]any{"role": "user", "content": "hi"}}}
	if stream {
		req["stream"] = true
	}
	body, err := json.Marshal(req)
	require.NoError(t, err)
	return runJob(t, answer, body, estCfg)
}

// runJob runs one job of the Anthropic request body (at most ~800 input tokens by the rule and
// 16 output tokens: the minute's 1,000 and 30) against the provider answer, with an estimator of
// estCfg (nil: the defaults), and returns what it ran.
func runJob(t *testing.T, answer http.Handler, body []byte, estCfg *estimator.Config) answeredRun {
	t.Helper()
	ctx := t.Context()
	b := jobstest.New(t)
	rdb := redistest.Client(t)
	lim, _ := sharedAdmission(t, rdb)
	srv := httptest.NewServer(answer)
	t.Cleanup(srv.Close)
	p, err := llm.New(llm.Config{Kind: llm.KindAnthropic, BaseURL: srv.URL, APIKey: "sk-cache"})
	require.NoError(t, err)
	est, err := estimator.New(estCfg)
	require.NoError(t, err)
	limit := limiter.Limit{Rate: 100, Burst: 1, InputTokensPerMinute: 1000, OutputTokensPerMinute: 30}
	gate := lim.Gate("sk-cache", "cache")
	ex := executor.New(executor.Config{Store: b.Store, Policy: retrypolicy.New(nil), Estimator: est,
		Deltas: deltastream.New(deltastream.Config{Redis: rdb, Prefix: redistest.Prefix(t)}),
		Upstreams: map[string]executor.Upstream{"cache": {Name: "cache", Kind: string(llm.KindAnthropic),
			Provider: p, Gate: gate, Limit: limit}}})
	_, err = gate.Reserve(ctx, limit) // the request bucket's burst taken: the job's slot is a refill's
	require.NoError(t, err)
	job, _, err := b.Store.Create(ctx, jobs.CreateParams{Tenant: "default", Credential: "cache", Request: body,
		MaxAttempts: 1, Timeout: time.Minute})
	require.NoError(t, err)
	require.NoError(t, ex.Process(ctx, dispatch.Delivery{JobID: job.ID}))
	got, err := b.Store.Get(ctx, job.ID)
	require.NoError(t, err)
	require.Equal(t, jobs.StatusSucceeded, got.Status)
	attempts, err := b.Store.Attempts(ctx, job.ID)
	require.NoError(t, err)
	return answeredRun{gate: gate, limit: limit, est: est, job: got, attempts: attempts}
}

// Anthropic's input-token limit counts the tokens written to the prompt cache
// (cache_creation_input_tokens) besides input_tokens, the input after the last cache breakpoint:
// the reconciled grant keeps them charged, streamed or not. Refunded down to input_tokens, the
// next requests overdraw the provider's limit and meet 429s.
func TestExecutor_CacheCreationTokensStayCharged(t *testing.T) {
	t.Parallel()
	for _, stream := range []bool{false, true} {
		t.Run(fmt.Sprintf("stream=%v", stream), func(t *testing.T) {
			t.Parallel()
			gate, limit, _ := runCached(t,
				`{"input_tokens":5,"cache_creation_input_tokens":600,"cache_read_input_tokens":0,"output_tokens":3}`, stream)
			// Of the minute's 1,000 input tokens 605 are in use: another 625 wait for the refill.
			r, err := gate.ReserveCost(t.Context(), limit, tokens.Cost{InputTokens: 625})
			require.NoError(t, err)
			require.Greater(t, r.Wait, time.Second, "the tokens written to the cache were refunded as if never counted")
		})
	}
}

// Cache reads do not count toward the input-token limit (current Claude models): the grant is
// refunded down to the uncached input. But the estimate is of the whole prompt, whatever the
// cache holds: the ratio learned compares it with the whole prompt the provider read (input,
// cache creation and cache read), not with the uncached part alone, or a credential whose
// prompts are cached learns a ratio at MinRatio and under-reserves every request not cached.
func TestExecutor_CacheReadTokensRefundedNotLearned(t *testing.T) {
	t.Parallel()
	for _, stream := range []bool{false, true} {
		t.Run(fmt.Sprintf("stream=%v", stream), func(t *testing.T) {
			t.Parallel()
			gate, limit, est := runCached(t,
				`{"input_tokens":5,"cache_creation_input_tokens":0,"cache_read_input_tokens":600,"output_tokens":3}`, stream)
			r, err := gate.ReserveCost(t.Context(), limit, tokens.Cost{InputTokens: 900})
			require.NoError(t, err)
			require.True(t, r.Granted, "the cache read was charged against the input-token limit (wait %s)", r.Wait)
			require.InDelta(t, 605.0/502, est.Ratio("cache", "default", "claude-test"), 0.05,
				"the ratio learned from the uncached input alone")
		})
	}
}
