package config_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/config"
)

func TestParse_Retention(t *testing.T) {
	t.Parallel()
	const day = 24 * time.Hour

	t.Run("Defaults", func(t *testing.T) {
		t.Parallel()
		cfg, err := config.Parse(minimal(goodCred, ""), secretEnv)
		require.NoError(t, err)
		require.Equal(t, config.Retention{Succeeded: config.Keep(7 * day), Failed: config.Keep(7 * day),
			Canceled: config.Keep(7 * day), Dead: config.Keep(30 * day), Audit: config.Keep(365 * day), Interval: time.Minute}, cfg.Retention)
	})

	t.Run("Interval", func(t *testing.T) {
		t.Parallel()
		cfg, err := config.Parse(minimal(goodCred, "retention: { interval: 5s }\n"), secretEnv)
		require.NoError(t, err)
		require.Equal(t, 5*time.Second, cfg.Retention.Interval)
		require.Equal(t, config.Keep(7*day), cfg.Retention.Succeeded, "the periods keep their defaults")
	})

	t.Run("DaysDurationsAndOff", func(t *testing.T) {
		t.Parallel()
		cfg, err := config.Parse(minimal(goodCred, "retention: { succeeded: 1d, failed: 36h, canceled: off, dead: 0, audit: 90d }\n"), secretEnv)
		require.NoError(t, err)
		require.Equal(t, day, cfg.Retention.Succeeded.Duration())
		require.Equal(t, 36*time.Hour, cfg.Retention.Failed.Duration())
		require.Zero(t, cfg.Retention.Canceled.Duration(), "off: kept forever")
		require.Zero(t, cfg.Retention.Dead.Duration(), "0: kept forever, not the default")
		require.Equal(t, 90*day, cfg.Retention.Audit.Duration())
	})

	t.Run("UnwrittenFieldsTakeTheirDefault", func(t *testing.T) {
		t.Parallel()
		cfg, err := config.Parse(minimal(goodCred, "retention: { dead: 90d }\n"), secretEnv)
		require.NoError(t, err)
		require.Equal(t, config.Retention{Succeeded: config.Keep(7 * day), Failed: config.Keep(7 * day),
			Canceled: config.Keep(7 * day), Dead: config.Keep(90 * day), Audit: config.Keep(365 * day), Interval: time.Minute}, cfg.Retention)
	})

	for name, c := range map[string]struct{ yaml, field string }{
		"NoUnit":       {"retention: { succeeded: 7 }\n", `retention.succeeded: must be a duration such as 36h, a number of days such as 7d, or off (got "7")`},
		"Negative":     {"retention: { failed: -1h }\n", "retention.failed: must be a duration"},
		"NegativeDays": {"retention: { canceled: -2d }\n", "retention.canceled: must be a duration"},
		"FractionDays": {"retention: { dead: 1.5d }\n", "retention.dead: must be a duration"},
		"Mixed":        {"retention: { dead: 1d12h }\n", "retention.dead: must be a duration"},
		"NotAScalar":   {"retention: { succeeded: [7d] }\n", "retention.succeeded: must be a duration"},
		"UnknownField": {"retention: { completed: 7d }\n", "unknown key completed"},
		"BadInterval":  {"retention: { interval: -1s }\n", "retention.interval: must be at least 100ms"},
		"BadAudit":     {"retention: { audit: 1y }\n", "retention.audit: must be a duration"},
		// A month written as "1m" (a minute in a Go duration) deleted every dead letter a minute
		// after it died, and a result before a slow client read it (its key with it: a retried
		// submit made and paid for a second job).
		"Minutes":    {"retention: { dead: 1m }\n", "retention.dead: must be at least 1h, or off (got 1m0s; m is minutes: a month is 30d)"},
		"Seconds":    {"retention: { succeeded: 90s }\n", "retention.succeeded: must be at least 1h"},
		"AuditShort": {"retention: { audit: 59m }\n", "retention.audit: must be at least 1h"},
		// A period left empty (meant as off, or a value forgotten) took the default silently:
		// yaml.v3 does not hand a null to Period's unmarshaler.
		"Empty":      {"retention: { dead: }\n", "retention.dead: empty value: write a period such as 30d, or off"},
		"EmptyBlock": {"retention:\n  succeeded: 1d\n  audit:\n", "retention.audit: empty value: write a period such as 30d, or off"},
		"Null":       {"retention: { failed: null }\n", "retention.failed: empty value"},
		"Tilde":      {"retention: { canceled: ~ }\n", "retention.canceled: empty value"},
		// An alias to a null is a null: the first check saw only the alias node.
		"AliasToNull": {"retention: { dead: &none ~, failed: *none }\n", "retention.failed: empty value"},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			cfg, err := config.Parse(minimal(goodCred, c.yaml), secretEnv)
			require.Nil(t, cfg)
			require.ErrorContains(t, err, c.field)
		})
	}
}
