package llmsim_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/openai/openai-go/v3"
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

// TestServer_ContextTokensInABatch: a batch's request over the model's context window is refused
// as online, in its own result (the batch runs its other requests): Anthropic's errored result
// with invalid_request_error "prompt is too long", OpenAI's error-file line with its 400 and code
// context_length_exceeded.
func TestServer_ContextTokensInABatch(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	long := strings.Repeat("abcd", 10) // 10 input tokens

	t.Run("Anthropic", func(t *testing.T) {
		t.Parallel()
		b := setup(t, llmsim.Config{ContextTokens: 9, Batch: llmsim.BatchConfig{ProcessingDelay: time.Hour}})
		c := b.anthropicClient("sk-ant-test").Messages.Batches
		batch, err := c.New(ctx, anthropic.MessageBatchNewParams{Requests: []anthropic.MessageBatchNewParamsRequest{
			anthropicBatchRequest("long", long), anthropicBatchRequest("short", "abcd")}})
		require.NoError(t, err)
		b.clock.Advance(time.Hour)
		stream := c.ResultsStreaming(ctx, batch.ID, anthropic.MessageBatchResultsParams{})
		results := map[string]anthropic.MessageBatchIndividualResponse{}
		for stream.Next() {
			results[stream.Current().CustomID] = stream.Current()
		}
		require.NoError(t, stream.Err())
		require.Equal(t, "succeeded", results["short"].Result.Type)
		require.Equal(t, "errored", results["long"].Result.Type)
		require.Equal(t, "invalid_request_error", string(results["long"].Result.Error.Error.Type))
		require.Equal(t, "prompt is too long: 10 tokens > 9 maximum", results["long"].Result.Error.Error.Message)
	})
	t.Run("OpenAI", func(t *testing.T) {
		t.Parallel()
		// 10 input + 4 max_tokens = 14 > 13; 1 + 4 fits.
		b := setup(t, llmsim.Config{ContextTokens: 13, Batch: llmsim.BatchConfig{ProcessingDelay: time.Hour}})
		c := b.openaiClient("sk-test")
		line := func(id, text string) string {
			return `{"custom_id":"` + id + `","method":"POST","url":"/v1/chat/completions","body":{"model":"gpt-sim",` +
				`"max_tokens":4,"messages":[{"role":"user","content":"` + text + `"}]}}` + "\n"
		}
		file, err := c.Files.New(ctx, openai.FileNewParams{Purpose: openai.FilePurposeBatch,
			File: openai.File(strings.NewReader(line("long", long)+line("short", "abcd")), "in.jsonl", "application/jsonl")})
		require.NoError(t, err)
		batch, err := c.Batches.New(ctx, openai.BatchNewParams{InputFileID: file.ID,
			Endpoint: openai.BatchNewParamsEndpointV1ChatCompletions, CompletionWindow: openai.BatchNewParamsCompletionWindow24h})
		require.NoError(t, err)
		b.clock.Advance(time.Hour)
		got, err := c.Batches.Get(ctx, batch.ID)
		require.NoError(t, err)
		require.EqualValues(t, 1, got.RequestCounts.Completed)
		require.EqualValues(t, 1, got.RequestCounts.Failed)
		resp, err := c.Files.Content(ctx, got.ErrorFileID)
		require.NoError(t, err)
		defer resp.Body.Close()
		var l struct {
			CustomID string `json:"custom_id"`
			Response struct {
				StatusCode int `json:"status_code"`
				Body       struct {
					Error struct {
						Code    string `json:"code"`
						Message string `json:"message"`
					} `json:"error"`
				} `json:"body"`
			} `json:"response"`
		}
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&l))
		require.Equal(t, "long", l.CustomID)
		require.Equal(t, http.StatusBadRequest, l.Response.StatusCode)
		require.Equal(t, "context_length_exceeded", l.Response.Body.Error.Code)
		require.Contains(t, l.Response.Body.Error.Message, "maximum context length is 13 tokens")
	})
}
