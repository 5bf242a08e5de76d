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

// TestSend_EmptyErrorInAnswerIsAnAnswer proves that an answer whose top-level "error" says
// nothing ({} or an object of empty fields: what some OpenAI-compatible servers put in every
// answer, a serialized empty struct; LiteLLM had to accept it too, BerriAI/litellm#18493) is an
// answer, not an error that would retry, and pay for, an answer already given.
func TestSend_EmptyErrorInAnswerIsAnAnswer(t *testing.T) {
	t.Parallel()

	for name, errValue := range map[string]string{
		"EmptyObject":  `{}`,
		"EmptyFields":  `{"message":"","type":"","param":"","code":null}`,
		"EmptyString":  `""`,
		"ObjectSpaced": ` { } `,
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()

			body := `{"id":"chatcmpl-1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":1},"error":` + errValue + `}`
			b := setup(t, llm.KindOpenAI, reply(200, body))
			resp, err := b.provider.Send(callContext(t), bodyFor(llm.KindOpenAI), llm.SendOptions{})
			require.NoError(t, err, "an answer whose error field is empty")
			defer resp.Release()
			require.JSONEq(t, body, string(resp.Body))
			require.Equal(t, 1, resp.Usage.OutputTokens)
		})
	}
}

// TestSend_MalformedCloseDelimitedBodyIsADecodeError proves that a close-delimited 2xx body that
// is whole but malformed, its fault at its last byte, stays a decode error (not retried): only a
// body whose JSON ended early is a short read.
func TestSend_MalformedCloseDelimitedBodyIsADecodeError(t *testing.T) {
	t.Parallel()

	b := setup(t, llm.KindOpenAI, func(w http.ResponseWriter, _ *http.Request) {
		conn, buf, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		defer conn.Close()
		_, _ = io.WriteString(buf, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n\r\n"+
			`{"id":"chatcmpl-1","object":"chat.completion","choices":[],}`)
		_ = buf.Flush()
	})
	resp, err := b.provider.Send(callContext(t), bodyFor(llm.KindOpenAI), llm.SendOptions{})
	require.ErrorIs(t, err, llm.ErrDecode)
	require.NotNil(t, resp)
	resp.Release()
}

// TestSend_JSONCutAtCloseInAnyValueIsANetworkError: a close-delimited body cut inside a number, a
// literal or a string escape is a short read as one cut inside a string is.
func TestSend_JSONCutAtCloseInAnyValueIsANetworkError(t *testing.T) {
	t.Parallel()

	for name, cut := range map[string]string{
		"Number":  `{"id":"chatcmpl-1","usage":{"prompt_tokens":12`,
		"Literal": `{"id":"chatcmpl-1","error":nu`,
		"Escape":  `{"id":"chatcmpl-1","choices":[{"message":{"content":"a\u00`,
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()

			b := setup(t, llm.KindOpenAI, func(w http.ResponseWriter, _ *http.Request) {
				conn, buf, err := http.NewResponseController(w).Hijack()
				if err != nil {
					return
				}
				defer conn.Close()
				_, _ = io.WriteString(buf, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n\r\n"+cut)
				_ = buf.Flush()
			})
			resp, err := b.provider.Send(callContext(t), bodyFor(llm.KindOpenAI), llm.SendOptions{})
			resp.Release()
			asTransportError(t, err)
		})
	}
}

// TestSend_ErrorInAnswerGivesItsRoomBack: an answer turned into an error (an error object under a
// 2xx, a close-delimited body cut short) holds none of the answer budget once Send returns, or the
// worker's later calls would wait for room nothing gives back.
func TestSend_ErrorInAnswerGivesItsRoomBack(t *testing.T) {
	t.Parallel()

	for name, h := range map[string]http.HandlerFunc{
		"ErrorObject": reply(200, `{"error":{"type":"server_error","message":"boom"}}`),
		"CutAtClose": func(w http.ResponseWriter, _ *http.Request) {
			conn, buf, err := http.NewResponseController(w).Hijack()
			if err != nil {
				return
			}
			defer conn.Close()
			_, _ = io.WriteString(buf, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n\r\n"+`{"id":"chatcmpl-1","choices":[`)
			_ = buf.Flush()
		},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()

			budget, err := llm.NewAnswerBudget(192<<10, 128<<10)
			require.NoError(t, err)
			b := setup(t, llm.KindOpenAI, h, bundleOpts{budget: budget, maxBytes: 64 << 10})
			resp, err := b.provider.Send(callContext(t), bodyFor(llm.KindOpenAI), llm.SendOptions{})
			require.Error(t, err)
			require.Nil(t, resp)
			require.Zero(t, budget.InUse())
		})
	}
}
