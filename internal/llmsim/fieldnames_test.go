package llmsim_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/llmsim"
)

// TestServer_ReadsFieldNamesExactly: the providers match a request's field names exactly; so
// does the simulator, or a test using it as the provider could pass with a body the real one
// reads otherwise. A name in another case (Unicode folding included) is not the field: "Stream"
// does not stream, "Model" is no model, "Content" and "Text" are no text, "Include_Usage" adds
// no usage chunk, "Custom_ID" is no custom_id. Escapes decode, as in any JSON parser.
func TestServer_ReadsFieldNamesExactly(t *testing.T) {
	t.Parallel()
	b := setup(t, llmsim.Config{})

	r := b.anthropic(t, "k", `{"model":"m","max_tokens":64,"Stream":true,"messages":[{"role":"user","content":"hi"}]}`)
	require.Equal(t, http.StatusOK, r.status, "body: %s", r.body)
	require.Equal(t, "application/json", r.header.Get("content-type"), "\"Stream\" is not stream: no SSE")
	r = b.openai(t, "k", `{"model":"m","ſtream":true,"messages":[{"role":"user","content":"hi"}]}`)
	require.Equal(t, "application/json", r.header.Get("content-type"), "\"ſtream\" is not stream: no SSE")

	r = b.anthropic(t, "k", `{"Model":"m","max_tokens":64,"messages":[{"role":"user","content":"hi"}]}`)
	require.Equal(t, http.StatusBadRequest, r.status, "body: %s", r.body)
	require.Contains(t, string(r.body), "model: Field required")
	r = b.anthropic(t, "k", `{"model":"m","max_tokens":64,"messages":[{"Role":"user","content":"hi"}]}`)
	require.Equal(t, http.StatusBadRequest, r.status, "body: %s", r.body)
	require.Contains(t, string(r.body), "messages.0.role: Field required")

	// 16 bytes of text in "Content" and "Text": none of it is read, so 1 input token, and no quote.
	for _, body := range []string{
		`{"model":"m","max_tokens":64,"messages":[{"role":"user","Content":"sixteen bytes!!!"}]}`,
		`{"model":"m","max_tokens":64,"messages":[{"role":"user","content":[{"type":"text","Text":"sixteen bytes!!!"}]}]}`,
		`{"model":"m","max_tokens":64,"messages":[{"role":"user","content":[{"TYPE":"text","text":"sixteen bytes!!!"}]}]}`,
		`{"model":"m","max_tokens":64,"SYSTEM":"sixteen bytes!!!","messages":[{"role":"user","content":""}]}`,
	} {
		r = b.anthropic(t, "k", body)
		require.Equal(t, http.StatusOK, r.status, "body: %s", r.body)
		m := r.json(t)
		require.EqualValues(t, 1, m["usage"].(map[string]any)["input_tokens"], body)
		require.NotContains(t, string(r.body), "sixteen", body)
	}
	// Written with escapes, a name is the same name.
	r = b.anthropic(t, "k", `{"model":"m","max_tokens":64,"messages":[{"role":"user","c\u006fntent":"sixteen bytes!!!"}]}`)
	require.EqualValues(t, 4, r.json(t)["usage"].(map[string]any)["input_tokens"])

	r = b.openai(t, "k", `{"model":"m","stream":true,"stream_options":{"Include_Usage":true},"messages":[{"role":"user","content":"hi"}]}`)
	require.Equal(t, http.StatusOK, r.status, "body: %s", r.body)
	require.NotContains(t, string(r.body), `"usage":{`, "\"Include_Usage\" is not include_usage")
	r = b.openai(t, "k", `{"model":"m","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"hi"}]}`)
	require.Contains(t, string(r.body), `"usage":{`)

	r = b.mustDo(t, http.MethodPost, "/v1/messages/batches", map[string]string{"x-api-key": "k", "anthropic-version": "2023-06-01"},
		`{"requests":[{"Custom_ID":"a","params":{"model":"m","max_tokens":8,"messages":[{"role":"user","content":"hi"}]}}]}`)
	require.Equal(t, http.StatusBadRequest, r.status, "body: %s", r.body)
	require.True(t, strings.Contains(string(r.body), "custom_id"), "body: %s", r.body)
}

// TestServer_IntegralMaxTokens: the providers read max_tokens 4096.0 as 4096 (their JSON Schema's
// "integer"); so does the simulator when it enforces token limits, rather than a 400.
func TestServer_IntegralMaxTokens(t *testing.T) {
	t.Parallel()
	b := setup(t, llmsim.Config{OutputTokensPerMinute: 100000})
	for _, v := range []string{`64.0`, `6.4e1`} {
		r := b.anthropic(t, "k", `{"model":"m","max_tokens":`+v+`,"messages":[{"role":"user","content":"hi"}]}`)
		require.Equal(t, http.StatusOK, r.status, "max_tokens %s: %s", v, r.body)
	}
	for _, v := range []string{`64.5`, `"64"`, `0.0`} {
		r := b.anthropic(t, "k", `{"model":"m","max_tokens":`+v+`,"messages":[{"role":"user","content":"hi"}]}`)
		require.Equal(t, http.StatusBadRequest, r.status, "max_tokens %s: %s", v, r.body)
		require.Contains(t, string(r.body), "max_tokens: must be a positive integer")
	}
}
