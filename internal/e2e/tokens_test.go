package e2e_test

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/limiter"
	"github.com/llmq/llmq/internal/llmsim"
)

// Large prompts against an input-token bucket: with the token limit known, the limiter paces by
// tokens and the provider refuses nothing, although the request limit alone would let every job
// go at once. Counts, not times, are asserted.
func TestTokens_KnownTokenLimitAvoids429s(t *testing.T) {
	t.Parallel()
	const n = 12
	b := setup(t, setupOpts{
		sim: llmsim.Config{Capacity: 100, RefillPerSecond: 100, InputTokensPerMinute: 400,
			OutputTokensPerMinute: 1000, TokenMinute: time.Second, ReplyTokens: 10},
		limits: "{requests_per_second: 100, burst: 100, input_tokens_per_minute: 400, output_tokens_per_minute: 1000}",
		// A token minute of 1 s makes every ms of a request's lateness 60 times the share of a
		// refill it is with a real minute. The simulator's bucket sits full until the first burst
		// lands, so that burst's lateness after its grants must stay within the margin. Under the
		// race detector, beside the rest of the suite on a loaded machine, it has exceeded 500 ms
		// (one 429 in three runs of the package with two busy loops on both cores): hence 2 s.
		// Such a margin would also hide pacing a few times too fast; the pacing's arithmetic is
		// the limiter's own tests' (TestCredential_ReserveCost_NeverExceedsBuckets, on an
		// injected clock), this test that a known token limit reaches it.
		worker: "token_minute: 1s, phase_margin: 2s",
	})
	prompt := strings.Repeat("word ", 80) // 400 bytes: 100 input tokens by the simulator's rule
	ids := make([]string, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			ids[i] = b.submit(t, fmt.Sprintf(`{"max_attempts":10,"request":{"model":"m","max_tokens":10,"messages":[{"role":"user","content":%q}]}}`, prompt))
		})
	}
	wg.Wait()
	for _, id := range ids {
		job := b.waitTerminal(t, id)
		require.Equal(t, "succeeded", job["status"])
		require.EqualValues(t, 100, job["usage"].(map[string]any)["input_tokens"])
	}
	st := b.sim.Stats()
	require.Zero(t, st.ByStatus[429], "the provider refused requests: %v", st.ByStatus)
	require.Equal(t, n, st.Requests)
	require.Equal(t, n*100, st.InputTokens)
}

func TestTokens_RequestLargerThanABucketRefusedAtSubmit(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{
		noWorker: true,
		limits:   "{requests_per_second: 10, burst: 10, input_tokens_per_minute: 1000, output_tokens_per_minute: 500}",
	})
	r := b.do(t, "POST", "/v1/jobs", `{"request":{"model":"m","max_tokens":600,"messages":[{"role":"user","content":"hi"}]}}`, nil)
	require.Equal(t, 400, r.status)
	e := r.body["error"].(map[string]any)
	require.Equal(t, "request_too_large", e["type"])
	require.Contains(t, e["message"], "can never be sent")
	require.Equal(t, 0, b.countRows(t, "jobs"))

	ok := b.do(t, "POST", "/v1/jobs", `{"request":{"model":"m","max_tokens":400,"messages":[{"role":"user","content":"hi"}]}}`, nil)
	require.Equal(t, 202, ok.status)
}

// An agent's requests: their input is mostly tool results. The limiter reserves them as input,
// as the provider counts them, so a known input-token limit is kept without 429s (counted as the
// few bytes of their text blocks, the whole burst went at once and the provider refused most).
func TestTokens_ToolResultsAreReserved(t *testing.T) {
	t.Parallel()
	// "ok", the tool_use input {}, 397 bytes and a newline joining "": 402 bytes, 100 input tokens
	result := strings.Repeat("word ", 79) + "wo"
	body := fmt.Sprintf(`{"max_attempts":1,"request":{"model":"m","max_tokens":10,"messages":[
		{"role":"user","content":"ok"},
		{"role":"assistant","content":[{"type":"tool_use","id":"t1","name":"read","input":{}}]},
		{"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","content":%q},{"type":"text","text":""}]}]}}`, result)
	burstUnderInputLimit(t, body)
}

// An agent's turn carries its own tool calls (a file it wrote, in a tool_use input) and the
// documents it reads (text sources): the provider charges both as input, and the limiter reserves
// them, so a known input-token limit is kept without 429s (counted as the few bytes of their text
// blocks, the whole burst went at once and the provider refused most).
func TestTokens_ToolCallsAndDocumentsAreReserved(t *testing.T) {
	t.Parallel()
	doc := strings.Repeat("d", 195)
	input := `{"text":"` + strings.Repeat("w", 189) + `"}` // 200 bytes
	// 195 + a newline + "ok", the input's 200, the result's "ok": 400 bytes, 100 input tokens
	body := fmt.Sprintf(`{"max_attempts":1,"request":{"model":"m","max_tokens":10,"messages":[
		{"role":"user","content":[{"type":"document","source":{"type":"text","media_type":"text/plain","data":%q}},{"type":"text","text":"ok"}]},
		{"role":"assistant","content":[{"type":"tool_use","id":"t1","name":"write","input":%s}]},
		{"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","content":"ok"}]}]}}`, doc, input)
	burstUnderInputLimit(t, body)
}

// A request without max_tokens reserves the default allowance (4,096). Once the credential's
// output limit is learned below it, the job fails unsent, and its error says that the allowance
// was assumed rather than blaming a max_tokens the client never sent.
func TestTokens_AssumedOutputAboveALearnedLimitSaysSo(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{sim: llmsim.Config{InputTokensPerMinute: 100000, OutputTokensPerMinute: 1000}})
	first := b.waitTerminal(t, b.submit(t, anthropicBody("learn the limits")))
	require.Equal(t, "succeeded", first["status"])
	// The answer's headers reach the limiter while its result reaches Postgres: wait for them.
	gate := b.limiterCredential(t, "default")
	require.Eventually(t, func() bool {
		cur, err := gate.CurrentTokenBuckets(b.ctx)
		return err == nil && cur.Output.Source == limiter.SourceLearned && cur.Output.PerMinute == 1000
	}, 30*time.Second, 10*time.Millisecond, "the output limit is learned from the first answer")

	job := b.waitTerminal(t, b.submit(t, `{"request":{"model":"m","messages":[{"role":"user","content":"hi"}]}}`))
	require.Equal(t, "failed", job["status"])
	require.EqualValues(t, 0, job["attempts"], "it can never be sent: it is not")
	msg := job["last_error"].(map[string]any)["message"].(string)
	require.Contains(t, msg, "can never be sent")
	require.Contains(t, msg, "the request sets no max_tokens: 4096 assumed")
	require.Equal(t, 1, b.sim.Stats().Requests)
}

// burstUnderInputLimit submits 8 copies of body, a request of 100 input tokens by the provider's
// count, at once to a credential whose input-token limit (400 a "minute" of 1 s) is known to both
// llmq and llmsim: all succeed without a 429 only if llmq reserved their input as the provider
// counts it.
func burstUnderInputLimit(t *testing.T, body string) {
	t.Helper()
	const n = 8
	b := setup(t, setupOpts{
		sim: llmsim.Config{Capacity: 100, RefillPerSecond: 100, InputTokensPerMinute: 400,
			OutputTokensPerMinute: 1000, TokenMinute: time.Second, ReplyTokens: 10},
		limits: "{requests_per_second: 100, burst: 100, input_tokens_per_minute: 400, output_tokens_per_minute: 1000}",
		worker: "token_minute: 1s, phase_margin: 2s", // see TestTokens_KnownTokenLimitAvoids429s
	})
	ids := make([]string, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { ids[i] = b.submit(t, body) })
	}
	wg.Wait()
	for _, id := range ids {
		job := b.waitTerminal(t, id)
		require.Equal(t, "succeeded", job["status"], "%v", job["last_error"])
		require.EqualValues(t, 100, job["usage"].(map[string]any)["input_tokens"])
	}
	st := b.sim.Stats()
	require.Zero(t, st.ByStatus[429], "the provider refused requests: %v", st.ByStatus)
	require.Equal(t, n, st.Requests)
}
