package main

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/config"
)

// The config a run writes loads with llmq's own loader, says what the run's setup asks for,
// and holds no secret: the simulator's key comes from the environment.
func TestWriteConfig(t *testing.T) {
	t.Parallel()
	const db = "postgres://postgres@127.0.0.1:5432/llmq_bench_x?sslmode=disable"
	write := func(t *testing.T, s llmqSetup) *config.Config {
		t.Helper()
		path := filepath.Join(t.TempDir(), "llmq.yaml")
		cfg, err := writeConfig(path, db, "redis://127.0.0.1:6379/0", "llmq-bench-q", "http://127.0.0.1:9", "sk-x", s)
		require.NoError(t, err)
		require.Equal(t, "sk-x", cfg.Credentials[0].APIKey())
		raw, err := os.ReadFile(path)
		require.NoError(t, err)
		require.NotContains(t, string(raw), "sk-x")
		got, err := config.Load(path, func(k string) string { return map[string]string{simKeyEnv: "sk-from-env"}[k] })
		require.NoError(t, err)
		require.Equal(t, "sk-from-env", got.Credentials[0].APIKey())
		require.Equal(t, []string{db, "llmq-bench-q", "off", "http://127.0.0.1:9"},
			[]string{got.DatabaseURL, got.Worker.Queue, got.Worker.MetricsListen, got.Credentials[0].BaseURL})
		require.True(t, got.API.AllowAnonymous)
		return got
	}
	t.Run("Learned", func(t *testing.T) {
		t.Parallel()
		got := write(t, llmqSetup{})
		require.Nil(t, got.Credentials[0].Limits)
		require.Equal(t, config.Breaker{}, got.Breaker, "nothing set: the breaker's defaults apply")
	})
	t.Run("ConfiguredWithBreaker", func(t *testing.T) {
		t.Parallel()
		got := write(t, llmqSetup{limits: &config.Limits{RequestsPerSecond: 25, Burst: 50},
			breaker: &config.Breaker{Threshold: 3, Cooldown: 2 * time.Second, MaxCooldown: 2800 * time.Millisecond, ColdStartCap: new(true)}})
		require.Equal(t, &config.Limits{RequestsPerSecond: 25, Burst: 50}, got.Credentials[0].Limits)
		require.Equal(t, config.Breaker{Threshold: 3, Cooldown: 2 * time.Second, MaxCooldown: 2800 * time.Millisecond, ColdStartCap: new(true)}, got.Breaker)
	})
	t.Run("Tokens", func(t *testing.T) {
		t.Parallel()
		lim := &config.Limits{RequestsPerSecond: 50, Burst: 50, InputTokensPerMinute: 40000, OutputTokensPerMinute: 8000, TokensPerMinute: 48000}
		got := write(t, llmqSetup{limits: lim, tokenMinute: 6 * time.Second})
		require.Equal(t, lim, got.Credentials[0].Limits)
		require.Equal(t, 6*time.Second, got.Worker.TokenMinute)
	})
	t.Run("Retention", func(t *testing.T) {
		t.Parallel()
		got := write(t, retentionSetupFor(true))
		require.Equal(t, retentionInterval, got.Retention.Interval)
		require.Equal(t, config.DefaultRetention, got.Retention.Succeeded.Duration(), "the default periods")
		got = write(t, retentionSetupFor(false))
		for _, p := range []config.Period{got.Retention.Succeeded, got.Retention.Failed, got.Retention.Canceled, got.Retention.Dead} {
			require.Zero(t, p.Duration(), "off: kept forever")
		}
		require.Equal(t, config.DefaultRetentionInterval, write(t, llmqSetup{}).Retention.Interval)
	})
}
