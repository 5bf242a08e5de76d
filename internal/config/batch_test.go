package config_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/config"
)

func TestParse_Batch(t *testing.T) {
	t.Parallel()

	t.Run("Defaults", func(t *testing.T) {
		t.Parallel()
		cfg, err := config.Parse(minimal(goodCred, ""), secretEnv)
		require.NoError(t, err)
		require.Equal(t, config.Batch{Enabled: false, MaxRequestsPerBatch: 1000, MaxWaitToFill: time.Minute,
			PollInterval: 30 * time.Second, Window: 24 * time.Hour, OnlineFallback: 10 * time.Minute}, cfg.Credentials[0].Batch)
	})

	t.Run("Set", func(t *testing.T) {
		t.Parallel()
		cfg, err := config.Parse(minimal(goodCred+"\nbatch: { enabled: true, max_requests_per_batch: 50, max_wait_to_fill: 2s, poll_interval: 1s, window: 1h, online_fallback: 1m }", ""), secretEnv)
		require.NoError(t, err)
		require.Equal(t, config.Batch{Enabled: true, MaxRequestsPerBatch: 50, MaxWaitToFill: 2 * time.Second,
			PollInterval: time.Second, Window: time.Hour, OnlineFallback: time.Minute}, cfg.Credentials[0].Batch)
	})

	t.Run("AutoBatch", func(t *testing.T) {
		t.Parallel()
		b := config.Batch{Enabled: true, Window: time.Hour}
		require.True(t, b.AutoBatch(time.Hour), "a deadline one window away leaves room")
		require.False(t, b.AutoBatch(59*time.Minute), "a deadline inside the window does not")
		b.Enabled = false
		require.False(t, b.AutoBatch(24*time.Hour), "a credential without batches never batches")
	})

	for name, c := range map[string]struct{ batch, err string }{
		"TooMany":        {"max_requests_per_batch: 50001", "credentials[0].batch.max_requests_per_batch: must be between 1 and 50000 (got 50001)"},
		"Negative":       {"max_requests_per_batch: -1", "credentials[0].batch.max_requests_per_batch"},
		"NegativeFill":   {"max_wait_to_fill: -1s", "credentials[0].batch.max_wait_to_fill: must be a positive duration"},
		"NegativePoll":   {"poll_interval: -5s", "credentials[0].batch.poll_interval"},
		"WindowTooLong":  {"window: 25h", "credentials[0].batch.window: must be at most 24h0m0s"},
		"NegativeBackup": {"online_fallback: -1m", "credentials[0].batch.online_fallback"},
		"UnknownField":   {"windw: 1h", "unknown key windw (did you mean window?)"},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			_, err := config.Parse(minimal(goodCred+"\nbatch: { "+c.batch+" }", ""), secretEnv)
			require.ErrorContains(t, err, c.err)
		})
	}
}
