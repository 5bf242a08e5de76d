package llmsim_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/llmsim"
)

func TestServer_Answers(t *testing.T) {
	t.Parallel()

	t.Run("AnthropicSuccess", func(t *testing.T) {
		t.Parallel()
		b := setup(t, llmsim.Config{})
		r := b.anthropic(t, "k", helloBody)
		require.Equal(t, http.StatusOK, r.status, "body: %s", r.body)
		require.Equal(t, "application/json", r.header.Get("content-type"))
		m := r.json(t)
		id, _ := m["id"].(string)
		require.True(t, strings.HasPrefix(id, "msg_"), id)
		delete(m, "id")
		// "Hello, simulator!" is 17 bytes: 4 tokens; the reply is 34 bytes: 8.
		want := `{"type":"message","role":"assistant","model":"sim-model",
			"content":[{"type":"text","text":"llmsim reply to: Hello, simulator!"}],
			"stop_reason":"end_turn","stop_sequence":null,"usage":{"input_tokens":4,"output_tokens":8}}`
		got, err := json.Marshal(m)
		require.NoError(t, err)
		require.JSONEq(t, want, string(got))

		// As the real API: the same request again gets a new message id and request-id.
		r2 := b.anthropic(t, "k", helloBody)
		require.NotEqual(t, id, r2.json(t)["id"])
		require.NotEqual(t, r.header.Get("request-id"), r2.header.Get("request-id"))

		// The key may come as Authorization: Bearer too.
		r3 := b.mustDo(t, http.MethodPost, "/v1/messages", map[string]string{"anthropic-version": "2023-06-01",
			"content-type": "application/json", "authorization": "Bearer k"}, helloBody)
		require.Equal(t, http.StatusOK, r3.status, "body: %s", r3.body)
	})

	t.Run("OpenAISuccess", func(t *testing.T) {
		t.Parallel()
		b := setup(t, llmsim.Config{})
		body := `{"model":"gpt-sim","messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"Hi there"}]}`
		r := b.openai(t, "k", body)
		require.Equal(t, http.StatusOK, r.status, "body: %s", r.body)
		m := r.json(t)
		id, _ := m["id"].(string)
		require.True(t, strings.HasPrefix(id, "chatcmpl-"), id)
		delete(m, "id")
		got, err := json.Marshal(m)
		require.NoError(t, err)
		// 9+8 = 17 bytes in: 4 tokens; "llmsim reply to: Hi there" is 25 bytes: 6.
		require.JSONEq(t, `{"object":"chat.completion","created":1767323045,"model":"gpt-sim",
			"choices":[{"index":0,"message":{"role":"assistant","content":"llmsim reply to: Hi there","refusal":null,"annotations":[]},"logprobs":null,"finish_reason":"stop"}],
			"usage":{"prompt_tokens":4,"completion_tokens":6,"total_tokens":10}}`, string(got))
		require.NotEmpty(t, r.header.Get("x-request-id"))
	})

	t.Run("ReplyQuotesSixtyRunesOfLastUserMessage", func(t *testing.T) {
		t.Parallel()
		b := setup(t, llmsim.Config{})
		long := strings.Repeat("é", 100)
		body := `{"model":"m","system":[{"type":"text","text":"abcd"}],"messages":[
			{"role":"user","content":"first"},{"role":"assistant","content":"ok"},
			{"role":"user","content":[{"type":"text","text":"` + long + `"},{"type":"image","source":{}}]}]}`
		r := b.anthropic(t, "k", body)
		require.Equal(t, http.StatusOK, r.status, "body: %s", r.body)
		var msg struct {
			Content []struct{ Text string } `json:"content"`
			Usage   struct {
				InputTokens int `json:"input_tokens"`
			} `json:"usage"`
		}
		require.NoError(t, json.Unmarshal(r.body, &msg))
		require.Equal(t, "llmsim reply to: "+strings.Repeat("é", 60), msg.Content[0].Text)
		// 4 (system) + 5 + 2 + 200 bytes = 211 / 4 = 52, and an image whose source tells no size:
		// the most one image costs, 1,600.
		require.Equal(t, 52+1600, msg.Usage.InputTokens)
	})

	t.Run("MinimumOneToken", func(t *testing.T) {
		t.Parallel()
		b := setup(t, llmsim.Config{})
		r := b.openai(t, "k", `{"model":"m","messages":[{"role":"user","content":""}]}`)
		require.Equal(t, http.StatusOK, r.status)
		require.Equal(t, float64(1), r.json(t)["usage"].(map[string]any)["prompt_tokens"])
	})

	t.Run("MissingKey", func(t *testing.T) {
		t.Parallel()
		b := setup(t, llmsim.Config{Capacity: 5, RefillPerSecond: 1})
		r := b.anthropic(t, "", helloBody)
		require.Equal(t, http.StatusUnauthorized, r.status)
		require.Equal(t, "authentication_error", r.errType(t))
		require.Equal(t, "error", r.json(t)["type"])
		require.Empty(t, r.header.Values("anthropic-ratelimit-requests-limit"))

		r = b.openai(t, "", helloBody)
		require.Equal(t, http.StatusUnauthorized, r.status)
		require.Equal(t, "invalid_request_error", r.errType(t))
		e := r.json(t)["error"].(map[string]any)
		require.Contains(t, e, "param")
		require.Contains(t, e, "code")

		r = b.mustDo(t, http.MethodPost, "/v1/chat/completions", map[string]string{"authorization": "Basic abc"}, helloBody)
		require.Equal(t, http.StatusUnauthorized, r.status)
		require.Empty(t, b.sim.Stats().ByKey)
	})

	t.Run("MissingAnthropicVersion", func(t *testing.T) {
		t.Parallel()
		b := setup(t, llmsim.Config{})
		r := b.mustDo(t, http.MethodPost, "/v1/messages", map[string]string{"x-api-key": "k"}, helloBody)
		require.Equal(t, http.StatusBadRequest, r.status)
		require.Contains(t, string(r.body), "anthropic-version")
	})

	t.Run("InvalidBodies", func(t *testing.T) {
		t.Parallel()
		b := setup(t, llmsim.Config{})
		for body, want := range map[string]string{
			`not json`:                      "not a valid JSON object",
			`[1,2]`:                         "not a valid JSON object",
			`{"model":"m","messages":[]} x`: "not a valid JSON object",
			`{"messages":[{"role":"user","content":"x"}]}`:            "model",
			`{"model":"","messages":[{"role":"user","content":"x"}]}`: "model",
			`{"model":"m"}`:                                                           "messages",
			`{"model":"m","messages":[]}`:                                             "messages",
			`{"model":"m","messages":"hi"}`:                                           "messages",
			`{"model":"m","messages":[{"content":"x"}]}`:                              "messages.0.role",
			`{"model":"m","messages":[{"role":"user","content":7}]}`:                  "messages.0.content",
			`{"model":"m","stream":"yes","messages":[{"role":"user","content":"x"}]}`: "stream",
			`{"model":"m","system":5,"messages":[{"role":"user","content":"x"}]}`:     "system",
		} {
			for _, send := range []func(*testing.T, string, string) result{b.anthropic, b.openai} {
				r := send(t, "k", body)
				require.Equal(t, http.StatusBadRequest, r.status, "body %q", body)
				require.Equal(t, "invalid_request_error", r.errType(t), "body %q", body)
				require.Contains(t, string(r.body), want, "body %q", body)
			}
		}
	})

	t.Run("UnknownRoutes", func(t *testing.T) {
		t.Parallel()
		b := setup(t, llmsim.Config{})
		require.Equal(t, http.StatusNotFound, b.mustDo(t, http.MethodPost, "/v1/complete", nil, "").status)
		require.Equal(t, http.StatusMethodNotAllowed, b.mustDo(t, http.MethodGet, "/v1/messages", nil, "").status)
	})
}

func TestServer_StatsAndReset(t *testing.T) {
	t.Parallel()
	b := setup(t, llmsim.Config{Capacity: 2, RefillPerSecond: 1, Faults: llmsim.Faults{FailNext: 1, FailNextStatus: 503}})

	require.Equal(t, http.StatusServiceUnavailable, b.anthropic(t, "sk-secret-one", helloBody).status)
	require.Equal(t, http.StatusOK, b.anthropic(t, "sk-secret-one", helloBody).status)
	require.Equal(t, http.StatusTooManyRequests, b.anthropic(t, "sk-secret-one", helloBody).status)
	require.Equal(t, http.StatusOK, b.openai(t, "sk-secret-two", helloBody).status)
	require.Equal(t, http.StatusUnauthorized, b.openai(t, "", helloBody).status)

	raw := b.mustDo(t, http.MethodGet, "/_sim/stats", nil, "")
	require.NotContains(t, string(raw.body), "sk-secret")
	require.Contains(t, string(raw.body), `"by_status":{`)
	st := b.stats(t)
	one, two := llmsim.KeyID("sk-secret-one"), llmsim.KeyID("sk-secret-two")
	require.Regexp(t, `^key-[0-9a-f]{12}$`, one)
	require.Equal(t, llmsim.Stats{
		Requests: 5,
		ByStatus: map[int]int{200: 2, 401: 1, 429: 1, 503: 1},
		ByKey: map[string]llmsim.KeyStats{
			one: {Requests: 3, ByStatus: map[int]int{200: 1, 429: 1, 503: 1}},
			two: {Requests: 1, ByStatus: map[int]int{200: 1}},
		},
	}, st)

	// Faults changed at run time are replaced by the start faults on reset
	b.setFaults(t, `{"spend_cap":true}`)
	r := b.mustDo(t, http.MethodPost, "/_sim/reset", nil, "")
	require.Equal(t, http.StatusNoContent, r.status)
	require.Equal(t, llmsim.Stats{ByStatus: map[int]int{}, ByKey: map[string]llmsim.KeyStats{}}, b.stats(t))
	require.Equal(t, 1, b.sim.Faults().FailNext)
	require.False(t, b.sim.Faults().SpendCap)

	// Buckets are full again and the start script runs again
	require.Equal(t, http.StatusServiceUnavailable, b.anthropic(t, "sk-secret-one", helloBody).status)
	r = b.anthropic(t, "sk-secret-one", helloBody)
	require.Equal(t, http.StatusOK, r.status)
	require.Equal(t, "0", r.header.Get("anthropic-ratelimit-requests-remaining"))

	b.sim.Reset()
	require.Equal(t, 0, b.sim.Stats().Requests)
}
