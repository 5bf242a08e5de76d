package config_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/config"
)

func TestParse_Fairness(t *testing.T) {
	t.Parallel()

	t.Run("Defaults", func(t *testing.T) {
		t.Parallel()
		cfg, err := config.Parse(minimal(goodCred, ""), secretEnv)
		require.NoError(t, err)
		require.Equal(t, config.Fairness{MinShare: config.MinShare{Normal: 0.1, Low: 0.05}, Horizon: 50 * time.Millisecond},
			cfg.Fairness)
	})

	t.Run("Set", func(t *testing.T) {
		t.Parallel()
		cfg, err := config.Parse(minimal(goodCred, "fairness: { min_share: { low: 0.2 }, horizon: 1s }\n"), secretEnv)
		require.NoError(t, err)
		require.Equal(t, config.Fairness{MinShare: config.MinShare{Normal: 0.1, Low: 0.2}, Horizon: time.Second}, cfg.Fairness)
	})

	for name, c := range map[string]struct{ yaml, field string }{
		"LowTooSmall":          {"fairness: { min_share: { low: 0.001 } }\n", "fairness.min_share.low: must be between 0.01 and 0.5 (a fraction of the tenant's slots), got 0.001"},
		"NormalNegative":       {"fairness: { min_share: { normal: -0.1 } }\n", "fairness.min_share.normal: must be between 0.01 and 0.5"},
		"NormalTooLarge":       {"fairness: { min_share: { normal: 0.6 } }\n", "fairness.min_share.normal: must be between 0.01 and 0.5"},
		"NotANumber":           {"fairness: { min_share: { low: .nan } }\n", "fairness.min_share.low: must be between"},
		"SumAboveTheHighShare": {"fairness: { min_share: { normal: 0.5, low: 0.5 } }\n", "fairness.min_share: normal + low must be at most 0.9"},
		"HorizonTooShort":      {"fairness: { horizon: 1ms }\n", "fairness.horizon: must be between 10ms and 10s (got 1ms)"},
		"HorizonTooLong":       {"fairness: { horizon: 1m }\n", "fairness.horizon: must be between 10ms and 10s"},
		"UnknownField":         {"fairness: { min_share: { high: 0.1 } }\n", "unknown key high"},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			cfg, err := config.Parse(minimal(goodCred, c.yaml), secretEnv)
			require.Nil(t, cfg)
			require.ErrorContains(t, err, c.field)
		})
	}
}
