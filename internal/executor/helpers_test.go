package executor_test

import (
	"encoding/json"
	"net/http/httptest"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/breaker"
	"github.com/llmq/llmq/internal/limiter"
	"github.com/llmq/llmq/internal/llm"
	"github.com/llmq/llmq/internal/llmsim"
	"github.com/llmq/llmq/internal/redistest"
)

// helloRequest is a small Anthropic request body.
var helloRequest = json.RawMessage(`{"model":"claude-test","max_tokens":16,"messages":[{"role":"user","content":"hi"}]}`)

// sharedAdmission returns a limiter and a breaker on rdb, under the test's own key prefix.
func sharedAdmission(t *testing.T, rdb *redis.Client) (*limiter.Limiter, *breaker.Breaker) {
	t.Helper()
	prefix := redistest.Prefix(t)
	lim, err := limiter.New(rdb, &limiter.Config{Prefix: prefix})
	require.NoError(t, err)
	brk, err := breaker.New(rdb, &breaker.Config{Prefix: prefix})
	require.NoError(t, err)
	return lim, brk
}

// simProvider returns an Anthropic provider sending with key to a simulator configured by cfg,
// which runs until the test ends.
func simProvider(t *testing.T, cfg llmsim.Config, key string) llm.Provider {
	t.Helper()
	sim := httptest.NewServer(llmsim.New(cfg))
	t.Cleanup(sim.Close)
	p, err := llm.New(llm.Config{Kind: llm.KindAnthropic, BaseURL: sim.URL, APIKey: key})
	require.NoError(t, err)
	return p
}
