package main

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/config"
)

func TestWriteConfig(t *testing.T) {
	t.Parallel()
	const db = "postgres://postgres@127.0.0.1:5432/llmq_bench_x?sslmode=disable"
	load := func(t *testing.T, path string) *config.Config {
		t.Helper()
		cfg, err := config.Load(path, func(k string) string {
			if k == simKeyEnv {
				return "sk-from-env"
			}
			return ""
		})
		require.NoError(t, err)
		return cfg
	}
	t.Run("Configured", func(t *testing.T) {
		t.Parallel()
		path := filepath.Join(t.TempDir(), "llmq.yaml")
		cfg, err := writeConfig(path, db, "redis://127.0.0.1:6379/0", "llmq-bench-q", "http://127.0.0.1:9", "sk-x",
			llmqSetup{limits: &config.Limits{RequestsPerSecond: 10, Burst: 20}})
		require.NoError(t, err)
		require.Equal(t, "sk-x", cfg.Credentials[0].APIKey())
		got := load(t, path)
		require.Equal(t, db, got.DatabaseURL)
		require.Equal(t, "llmq-bench-q", got.Worker.Queue)
		require.Equal(t, "off", got.Worker.MetricsListen)
		require.True(t, got.API.AllowAnonymous)
		require.Len(t, got.Credentials, 1)
		c := got.Credentials[0]
		require.Equal(t, "default", c.Name)
		require.Equal(t, "anthropic", c.Provider)
		require.Equal(t, "http://127.0.0.1:9", c.BaseURL)
		require.Equal(t, "sk-from-env", c.APIKey(), "the key comes from the environment, not the file")
		require.Equal(t, &config.Limits{RequestsPerSecond: 10, Burst: 20}, c.Limits)
		raw, err := os.ReadFile(path)
		require.NoError(t, err)
		require.NotContains(t, string(raw), "sk-x")
	})
	t.Run("Learned", func(t *testing.T) {
		t.Parallel()
		path := filepath.Join(t.TempDir(), "llmq.yaml")
		_, err := writeConfig(path, db, "redis://127.0.0.1:6379/0", "q", "http://127.0.0.1:9", "sk-x", llmqSetup{})
		require.NoError(t, err)
		got := load(t, path)
		require.Nil(t, got.Credentials[0].Limits)
		require.Equal(t, config.Breaker{Threshold: 5, Cooldown: 30 * time.Second}, got.Breaker, "llmq's defaults")
	})
	t.Run("Breaker", func(t *testing.T) {
		t.Parallel()
		path := filepath.Join(t.TempDir(), "llmq.yaml")
		_, err := writeConfig(path, db, "redis://127.0.0.1:6379/0", "q", "http://127.0.0.1:9", "sk-x",
			llmqSetup{limits: &config.Limits{RequestsPerSecond: 25, Burst: 50}, breaker: &config.Breaker{Threshold: 3, Cooldown: 2500 * time.Millisecond}})
		require.NoError(t, err)
		got := load(t, path)
		require.Equal(t, config.Breaker{Threshold: 3, Cooldown: 2500 * time.Millisecond}, got.Breaker)
		require.Equal(t, &config.Limits{RequestsPerSecond: 25, Burst: 50}, got.Credentials[0].Limits)
	})
}
