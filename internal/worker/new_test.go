package worker_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/breaker"
	"github.com/llmq/llmq/internal/config"
	"github.com/llmq/llmq/internal/pgtest"
	"github.com/llmq/llmq/internal/redistest"
	"github.com/llmq/llmq/internal/worker"
)

// TestNew_ErrorNamesTheCredential: a credential New cannot build fails New with the
// credential's name, and leaves nothing running (the package's goleak check).
func TestNew_ErrorNamesTheCredential(t *testing.T) {
	cfg, err := config.Parse(fmt.Appendf(nil, `
database_url: %s
redis_url: %s
credentials:
  - { name: default, provider: anthropic, base_url: "http://127.0.0.1:1", api_key_env: K }
`, pgtest.URL(t), redistest.URL()), func(k string) string {
		if k == "K" {
			return "sk-test"
		}
		return ""
	})
	require.NoError(t, err)
	cfg.Credentials[0].Provider = "gemini" // past the config's own validation
	pool, err := pgxpool.New(context.Background(), cfg.DatabaseURL)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	_, err = worker.New(context.Background(), cfg, pool, worker.Options{RedisPrefix: redistest.Prefix(t)})
	require.ErrorContains(t, err, `credential "default"`)
}

// The breaker's probe outlives every credential's attempt timeout (config default 5m), and never
// falls below the breaker's own default.
func TestProbeTimeout_OutlivesEveryAttempt(t *testing.T) {
	t.Parallel()
	require.Equal(t, breaker.DefaultProbeTimeout, worker.ProbeTimeout(nil))
	require.Equal(t, breaker.DefaultProbeTimeout, worker.ProbeTimeout([]config.Credential{{AttemptTimeout: time.Minute}}))
	require.Equal(t, 10*time.Minute+30*time.Second, worker.ProbeTimeout([]config.Credential{
		{AttemptTimeout: 5 * time.Minute}, {AttemptTimeout: 10 * time.Minute}, {AttemptTimeout: time.Minute}}))
}
