package llmsim_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/llmsim"
)

// TestServer_ContextTokens: a request over the model's context window (Config.ContextTokens) is
// refused 400 in each provider's words, which clients recognize as "too large": Anthropic's
// invalid_request_error "prompt is too long: N tokens > M maximum" (the input alone), OpenAI's
// code context_length_exceeded (the input plus max_tokens). A request within it is answered.
func TestServer_ContextTokens(t *testing.T) {
	t.Parallel()
	// 40 bytes of text: 10 input tokens.
	long := `{"model":"m","max_tokens":4,"messages":[{"role":"user","content":"` + strings.Repeat("abcd", 10) + `"}]}`
	short := `{"model":"m","max_tokens":4,"messages":[{"role":"user","content":"abcd"}]}`

	t.Run("Anthropic", func(t *testing.T) {
		t.Parallel()
		b := setup(t, llmsim.Config{ContextTokens: 9})
		r := b.anthropic(t, "k", long)
		require.Equal(t, http.StatusBadRequest, r.status, "body: %s", r.body)
		require.Equal(t, "invalid_request_error", r.errType(t))
		require.Equal(t, "prompt is too long: 10 tokens > 9 maximum", r.json(t)["error"].(map[string]any)["message"])
		require.Equal(t, http.StatusOK, b.anthropic(t, "k", short).status)
	})
	t.Run("OpenAI", func(t *testing.T) {
		t.Parallel()
		// 10 input + 4 max_tokens = 14 > 13; 1 + 4 fits.
		b := setup(t, llmsim.Config{ContextTokens: 13})
		r := b.openai(t, "k", long)
		require.Equal(t, http.StatusBadRequest, r.status, "body: %s", r.body)
		require.Equal(t, "invalid_request_error", r.errType(t))
		e := r.json(t)["error"].(map[string]any)
		require.Equal(t, "context_length_exceeded", e["code"])
		require.Contains(t, e["message"], "maximum context length is 13 tokens")
		require.Equal(t, http.StatusOK, b.openai(t, "k", short).status)
	})
	t.Run("Off", func(t *testing.T) {
		t.Parallel()
		b := setup(t, llmsim.Config{})
		require.Equal(t, http.StatusOK, b.anthropic(t, "k", long).status)
	})
}
