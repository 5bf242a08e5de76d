package llm_test

import (
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/llm"
	"github.com/llmq/llmq/internal/retrypolicy"
)

// TestSend_ErrorObjectIn200IsAnError proves that a 200 whose body is the provider's error object
// (what OpenAI-compatible servers and gateways send, and what the providers' own error JSON is)
// is not taken for an answer: it is a *StatusError with the status the provider gives its type,
// classified as that status would be, so the job is retried or failed instead of succeeding with
// an error for its result.
func TestSend_ErrorObjectIn200IsAnError(t *testing.T) {
	t.Parallel()

	tests := []struct {
		name   string
		kind   llm.Kind
		body   string
		status int
		class  retrypolicy.Class
	}{
		{"OpenAIServerError", llm.KindOpenAI, `{"error":{"message":"The server had an error while processing your request.","type":"server_error","param":null,"code":null}}`,
			http.StatusInternalServerError, retrypolicy.ClassRetryable},
		{"AnthropicOverloaded", llm.KindAnthropic, `{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}`,
			529, retrypolicy.ClassRetryable},
		{"OpenAIContextLength", llm.KindOpenAI, `{"error":{"message":"too long","type":"invalid_request_error","param":"messages","code":"context_length_exceeded"}}`,
			http.StatusBadRequest, retrypolicy.ClassPermanent},
		{"GatewayErrorText", llm.KindOpenAI, `{"error":"upstream timed out"}`,
			http.StatusInternalServerError, retrypolicy.ClassRetryable},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()

			b := setup(t, tt.kind, reply(200, tt.body))
			resp, err := b.provider.Send(callContext(t), bodyFor(tt.kind), llm.SendOptions{})
			se := asStatusError(t, err)
			require.Nil(t, resp, "no answer to store")
			require.Equal(t, tt.status, se.StatusCode)
			require.Equal(t, tt.class, retrypolicy.Classify(err, time.Now()).Class)
			requireNoSecret(t, err)
		})
	}

	t.Run("NullErrorIsAnAnswer", func(t *testing.T) {
		t.Parallel()

		const body = `{"id":"chatcmpl-1","object":"chat.completion","choices":[],"error":null,"usage":{"prompt_tokens":3,"completion_tokens":1}}`
		b := setup(t, llm.KindOpenAI, reply(200, body))
		resp, err := b.provider.Send(callContext(t), bodyFor(llm.KindOpenAI), llm.SendOptions{})
		require.NoError(t, err)
		defer resp.Release()
		require.JSONEq(t, body, string(resp.Body))
	})
}

// TestSend_JSONCutAtCloseIsANetworkError proves that a 2xx body whose JSON ends early is a
// transport failure (retried), not an internal decode error (failed): a close-delimited body
// (no Content-Length, not chunked) ends cleanly when the server's process dies mid-write, so
// net/http reports no error and only the JSON shows the cut.
func TestSend_JSONCutAtCloseIsANetworkError(t *testing.T) {
	t.Parallel()

	b := setup(t, llm.KindOpenAI, func(w http.ResponseWriter, _ *http.Request) {
		conn, buf, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		defer conn.Close()
		_, _ = io.WriteString(buf, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n\r\n"+
			`{"id":"chatcmpl-1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"hel`)
		_ = buf.Flush()
	})
	resp, err := b.provider.Send(callContext(t), bodyFor(llm.KindOpenAI), llm.SendOptions{})
	resp.Release()
	require.Error(t, err)
	asTransportError(t, err)
	require.Equal(t, retrypolicy.Decision{Class: retrypolicy.ClassNetwork, Retry: true}, retrypolicy.Classify(err, time.Now()))
	requireNoSecret(t, err)
}
