package llmsim_test

import (
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"testing"

	"github.com/anthropics/anthropic-sdk-go/v2"
	aoption "github.com/anthropics/anthropic-sdk-go/v2/option"
	"github.com/openai/openai-go/v3"
	ooption "github.com/openai/openai-go/v3/option"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/llmsim"
)

// These tests check that the official SDKs accept the simulator's answers
// and parse its errors into their typed API errors. SDK retries are off: the
// simulator must be judged one answer at a time.

func (b *testBundle) anthropicClient(key string) *anthropic.Client {
	c := anthropic.NewClient(
		aoption.WithBaseURL(b.ts.URL),
		aoption.WithHTTPClient(b.ts.Client()),
		aoption.WithAPIKey(key),
		aoption.WithMaxRetries(0),
	)
	return &c
}

func (b *testBundle) openaiClient(key string) *openai.Client {
	c := openai.NewClient(
		ooption.WithBaseURL(b.ts.URL+"/v1/"),
		ooption.WithHTTPClient(b.ts.Client()),
		ooption.WithAPIKey(key),
		ooption.WithMaxRetries(0),
	)
	return &c
}

var anthropicHello = anthropic.MessageNewParams{
	Model:     "claude-sim",
	MaxTokens: 64,
	Messages:  []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("Hello, simulator!"))},
}

var openaiHello = openai.ChatCompletionNewParams{
	Model:    "gpt-sim",
	Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Hello, simulator!")},
}

func TestSDK_Anthropic(t *testing.T) {
	t.Parallel()

	t.Run("Message", func(t *testing.T) {
		t.Parallel()
		b := setup(t, llmsim.Config{Capacity: 10, RefillPerSecond: 1})
		msg, err := b.anthropicClient("sk-ant-test").Messages.New(t.Context(), anthropicHello)
		require.NoError(t, err)
		require.True(t, strings.HasPrefix(msg.ID, "msg_"), msg.ID)
		require.Equal(t, anthropic.Model("claude-sim"), msg.Model)
		require.Len(t, msg.Content, 1)
		require.Equal(t, "text", msg.Content[0].Type)
		require.Equal(t, "llmsim reply to: Hello, simulator!", msg.Content[0].Text)
		require.Equal(t, anthropic.StopReasonEndTurn, msg.StopReason)
		require.Equal(t, int64(4), msg.Usage.InputTokens)
		require.Equal(t, int64(8), msg.Usage.OutputTokens)
	})

	t.Run("AuthTokenAndNewIDs", func(t *testing.T) {
		t.Parallel()
		b := setup(t, llmsim.Config{})
		c := anthropic.NewClient(aoption.WithBaseURL(b.ts.URL), aoption.WithHTTPClient(b.ts.Client()),
			aoption.WithAuthToken("sk-ant-token"), aoption.WithMaxRetries(0))
		first, err := c.Messages.New(t.Context(), anthropicHello)
		require.NoError(t, err, "Authorization: Bearer is a key too")
		again, err := c.Messages.New(t.Context(), anthropicHello)
		require.NoError(t, err)
		require.NotEqual(t, first.ID, again.ID, "every call gets a new message id, as from the real API")
	})

	t.Run("RateLimited", func(t *testing.T) {
		t.Parallel()
		b := setup(t, llmsim.Config{Capacity: 1, RefillPerSecond: 0.5})
		client := b.anthropicClient("sk-ant-test")
		_, err := client.Messages.New(t.Context(), anthropicHello)
		require.NoError(t, err)

		_, err = client.Messages.New(t.Context(), anthropicHello)
		var apiErr *anthropic.Error
		require.ErrorAs(t, err, &apiErr)
		require.Equal(t, http.StatusTooManyRequests, apiErr.StatusCode)
		require.Equal(t, "rate_limit_error", string(apiErr.Type()))
		require.Equal(t, "2", apiErr.Response.Header.Get("retry-after"))
		require.Equal(t, "0", apiErr.Response.Header.Get("anthropic-ratelimit-requests-remaining"))
		require.True(t, strings.HasPrefix(apiErr.RequestID, "req_"), apiErr.RequestID)
	})

	t.Run("SpendCap", func(t *testing.T) {
		t.Parallel()
		b := setup(t, llmsim.Config{})
		require.NoError(t, b.sim.SetFaults(llmsim.Faults{SpendCap: true}))
		_, err := b.anthropicClient("sk-ant-test").Messages.New(t.Context(), anthropicHello)
		var apiErr *anthropic.Error
		require.ErrorAs(t, err, &apiErr)
		require.Equal(t, http.StatusTooManyRequests, apiErr.StatusCode)
		require.Equal(t, "rate_limit_error", string(apiErr.Type()))
		require.Empty(t, apiErr.Response.Header.Values("retry-after"))
		var body struct {
			Error struct {
				Details struct {
					ErrorCode string `json:"error_code"`
				} `json:"details"`
			} `json:"error"`
		}
		require.NoError(t, json.Unmarshal([]byte(apiErr.RawJSON()), &body))
		require.Equal(t, "enforced_spend_limit_reached", body.Error.Details.ErrorCode)
	})

	t.Run("Overloaded", func(t *testing.T) {
		t.Parallel()
		b := setup(t, llmsim.Config{Faults: llmsim.Faults{FailNext: 1, FailNextStatus: 529}})
		_, err := b.anthropicClient("k").Messages.New(t.Context(), anthropicHello)
		var apiErr *anthropic.Error
		require.ErrorAs(t, err, &apiErr)
		require.Equal(t, 529, apiErr.StatusCode)
		require.Equal(t, "overloaded_error", string(apiErr.Type()))
	})
}

func TestSDK_OpenAI(t *testing.T) {
	t.Parallel()

	t.Run("ChatCompletion", func(t *testing.T) {
		t.Parallel()
		b := setup(t, llmsim.Config{Capacity: 10, RefillPerSecond: 1})
		cc, err := b.openaiClient("sk-test").Chat.Completions.New(t.Context(), openaiHello)
		require.NoError(t, err)
		require.True(t, strings.HasPrefix(cc.ID, "chatcmpl-"), cc.ID)
		require.Equal(t, "gpt-sim", cc.Model)
		require.Equal(t, t0.Unix(), cc.Created)
		require.Len(t, cc.Choices, 1)
		require.Equal(t, "llmsim reply to: Hello, simulator!", cc.Choices[0].Message.Content)
		require.Equal(t, "stop", cc.Choices[0].FinishReason)
		require.Equal(t, int64(4), cc.Usage.PromptTokens)
		require.Equal(t, int64(8), cc.Usage.CompletionTokens)
		require.Equal(t, int64(12), cc.Usage.TotalTokens)
	})

	t.Run("RateLimited", func(t *testing.T) {
		t.Parallel()
		b := setup(t, llmsim.Config{Capacity: 1, RefillPerSecond: 0.5})
		client := b.openaiClient("sk-test")
		_, err := client.Chat.Completions.New(t.Context(), openaiHello)
		require.NoError(t, err)

		_, err = client.Chat.Completions.New(t.Context(), openaiHello)
		var apiErr *openai.Error
		require.ErrorAs(t, err, &apiErr)
		require.Equal(t, http.StatusTooManyRequests, apiErr.StatusCode)
		require.Equal(t, "requests", apiErr.Type)
		require.Equal(t, "rate_limit_exceeded", apiErr.Code)
		require.NotEmpty(t, apiErr.Message)
		require.Equal(t, "2", apiErr.Response.Header.Get("retry-after"))
		require.Equal(t, "2s", apiErr.Response.Header.Get("x-ratelimit-reset-requests"))
	})

	t.Run("SpendCap", func(t *testing.T) {
		t.Parallel()
		b := setup(t, llmsim.Config{})
		b.setFaults(t, `{"spend_cap":true}`)
		_, err := b.openaiClient("sk-test").Chat.Completions.New(t.Context(), openaiHello)
		var apiErr *openai.Error
		require.ErrorAs(t, err, &apiErr)
		require.Equal(t, http.StatusTooManyRequests, apiErr.StatusCode)
		require.Equal(t, "insufficient_quota", apiErr.Type)
		require.Equal(t, "insufficient_quota", apiErr.Code)
		require.Empty(t, apiErr.Response.Header.Values("retry-after"))
	})

	t.Run("BadRequestNotRetried", func(t *testing.T) {
		t.Parallel()
		b := setup(t, llmsim.Config{})
		params := openaiHello
		params.Messages = []openai.ChatCompletionMessageParamUnion{openai.UserMessage("x " + llmsim.DefaultBadRequestMarker)}
		_, err := b.openaiClient("sk-test").Chat.Completions.New(t.Context(), params)
		var apiErr *openai.Error
		require.True(t, errors.As(err, &apiErr), "err: %v", err)
		require.Equal(t, http.StatusBadRequest, apiErr.StatusCode)
		require.Equal(t, "invalid_request_error", apiErr.Type)
		require.Equal(t, 1, b.sim.Stats().Requests)
	})
}
