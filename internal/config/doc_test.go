package config_test

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/breaker"
	"github.com/llmq/llmq/internal/config"
	"github.com/llmq/llmq/internal/httpserve"
	"github.com/llmq/llmq/internal/limiter"
)

// docSections reads docs/configuration.md and returns its bullets ("- `retry`: ...") by the name
// they begin with, white space collapsed, so that a default is found across a line break.
func docSections(t *testing.T) map[string]string {
	t.Helper()
	md, err := os.ReadFile("../../docs/configuration.md")
	require.NoError(t, err)
	sections := map[string]string{}
	head := regexp.MustCompile("^`([a-z_]+)(?:\\[\\])?`")
	for _, b := range strings.Split(string(md), "\n- ")[1:] {
		m := head.FindStringSubmatch(b)
		require.NotNil(t, m, "docs/configuration.md: a bullet that does not begin with a setting: %.40q", b)
		sections[m[1]] = strings.Join(strings.Fields(b), " ")
	}
	return sections
}

// docValue returns what the section says of key: the text after its first "`key` (" (without
// one, its first "`key` ") up to
// the first ';', ',', ')' or ": ", backquotes removed.
func docValue(t *testing.T, section, text, key string) string {
	t.Helper()
	i := strings.Index(text, "`"+key+"` (")
	if i < 0 {
		i = strings.Index(text, "`"+key+"`")
	}
	require.GreaterOrEqual(t, i, 0, "docs/configuration.md, %s: no `%s`", section, key)
	v := strings.TrimPrefix(strings.TrimPrefix(text[i+len(key)+2:], " "), "(")
	if j := strings.IndexAny(v, ";,)"); j >= 0 {
		v = v[:j]
	}
	v, _, _ = strings.Cut(v, ": ")
	return strings.TrimSpace(strings.ReplaceAll(v, "`", ""))
}

// docDuration reads a documented duration: a Go duration, or none, off or 0 for zero.
func docDuration(t *testing.T, key, doc string) time.Duration {
	t.Helper()
	word, _, _ := strings.Cut(doc, " ")
	switch word {
	case "none", "off", "0":
		return 0
	}
	d, err := time.ParseDuration(word)
	require.NoError(t, err, "docs/configuration.md, %s: not a duration: %q", key, doc)
	return d
}

// docNumber reads a documented number: its first word, times a binary unit that follows it.
func docNumber(t *testing.T, key, doc string) int64 {
	t.Helper()
	f := strings.Fields(doc)
	require.NotEmpty(t, f, "docs/configuration.md, %s: no value", key)
	n, err := strconv.ParseInt(f[0], 10, 64)
	require.NoError(t, err, "docs/configuration.md, %s: not a number: %q", key, doc)
	if len(f) > 1 {
		n <<= map[string]int{"KiB": 10, "MiB": 20, "GiB": 30}[f[1]]
	}
	return n
}

// TestConfigurationDoc_DefaultsAreTheParsers: docs/configuration.md gives "every setting and its
// default" (README.md); each default it states is the one a file without that setting gets (or,
// for settings the config leaves at 0, the package's that applies it).
func TestConfigurationDoc_DefaultsAreTheParsers(t *testing.T) {
	t.Parallel()
	cfg, err := config.Parse(minimal(goodCred, ""), secretEnv)
	require.NoError(t, err)
	cr := cfg.Credentials[0]
	doc := docSections(t)

	durations := []struct {
		section, key string
		want         time.Duration
	}{
		{"credentials", "attempt_timeout", cr.AttemptTimeout},
		{"credentials", "first_byte_timeout", cr.FirstByteTimeout},
		{"credentials", "stall_timeout", cr.StallTimeout},
		{"credentials", "pause_probe_interval", cr.PauseProbeInterval},
		{"credentials", "max_wait_to_fill", cr.Batch.MaxWaitToFill},
		{"credentials", "poll_interval", cr.Batch.PollInterval},
		{"credentials", "window", cr.Batch.Window},
		{"credentials", "online_fallback", cr.Batch.OnlineFallback},
		{"retry", "base_delay", cfg.Retry.BaseDelay},
		{"retry", "max_delay", cfg.Retry.MaxDelay},
		{"retry", "max_retry_after", cfg.Retry.MaxRetryAfter},
		{"breaker", "cooldown", breaker.DefaultCooldown},
		{"breaker", "max_cooldown", breaker.DefaultMaxCooldown},
		{"worker", "token_minute", limiter.DefaultTokenMinute},
		{"worker", "sweep_interval", cfg.Worker.SweepInterval},
		{"worker", "poll_interval", cfg.Worker.PollInterval},
		{"worker", "phase_margin", cfg.Worker.PhaseMargin},
		{"retention", "interval", cfg.Retention.Interval},
		{"api", "stream_url_ttl", cfg.API.StreamURLTTL},
		{"api", "read_timeout", cfg.API.ReadTimeout},
		{"api", "write_timeout", cfg.API.WriteTimeout},
		{"api", "idle_timeout", cfg.API.IdleTimeout},
		{"api", "event_write_timeout", cfg.API.EventWriteTimeout},
		{"api", "drain_delay", cfg.API.DrainDelay},
		{"streaming", "buffer_ttl", cfg.Streaming.BufferTTL},
		{"streaming", "delta_spacing", cfg.Streaming.DeltaSpacing},
		{"fairness", "horizon", cfg.Fairness.Horizon},
	}
	for _, d := range durations {
		assert.Equal(t, d.want, docDuration(t, d.section+"."+d.key, docValue(t, d.section, doc[d.section], d.key)), "%s.%s", d.section, d.key)
	}

	numbers := []struct {
		section, key string
		want         int64
	}{
		{"credentials", "max_requests_per_batch", int64(cr.Batch.MaxRequestsPerBatch)},
		{"retry", "max_attempts", int64(cfg.Retry.MaxAttempts)},
		{"breaker", "threshold", breaker.DefaultThreshold},
		{"worker", "concurrency", int64(cfg.Worker.Concurrency)},
		{"worker", "max_answer_bytes", cfg.Worker.MaxAnswerBytes},
		{"worker", "backlog_steps", int64(cfg.Worker.BacklogSteps)},
		{"api", "max_body_bytes", cfg.API.MaxBodyBytes},
		{"api", "max_streams_per_tenant", int64(cfg.API.MaxStreamsPerTenant)},
		{"streaming", "buffer_max_entries", cfg.Streaming.BufferMaxEntries},
	}
	for _, n := range numbers {
		assert.Equal(t, n.want, docNumber(t, n.section+"."+n.key, docValue(t, n.section, doc[n.section], n.key)), "%s.%s", n.section, n.key)
	}

	words := []struct {
		section, key, want string
	}{
		{"database_url", "database_url", cfg.DatabaseURL},
		{"database_url", "redis_url", cfg.RedisURL},
		{"credentials", "enabled", onOff(cr.Batch.Enabled)},
		{"breaker", "cold_start_cap", onOff(cfg.Breaker.ColdStart())},
		{"alerts", "webhook_url", or(cfg.Alerts.WebhookURL, "none")},
		{"worker", "metrics_listen", cfg.Worker.MetricsListen},
		{"worker", "queue", cfg.Worker.Queue},
		{"api", "listen", cfg.API.Listen},
		{"api", "tenant_submit_rate", map[bool]string{true: "off"}[cfg.API.TenantSubmitRate == nil]},
	}
	for _, w := range words {
		assert.Equal(t, w.want, docValue(t, w.section, doc[w.section], w.key), "%s.%s", w.section, w.key)
	}

	// Those written otherwise: as a sentence, or several to one value.
	phrases := map[string]string{
		"retention": fmt.Sprintf("`succeeded`/`failed`/`canceled` %s, `dead` %s, and the audit log's entries after `audit` %s",
			days(t, cfg.Retention.Succeeded, cfg.Retention.Failed, cfg.Retention.Canceled), days(t, cfg.Retention.Dead), days(t, cfg.Retention.Audit)),
		"fairness": fmt.Sprintf("(`normal` %v, `low` %v of its tenant's slots", cfg.Fairness.MinShare.Normal, cfg.Fairness.MinShare.Low),
		"api": fmt.Sprintf("`max_body_bytes_in_flight` (%d × `max_body_bytes`", cfg.API.MaxBodyBytesInFlight/cfg.API.MaxBodyBytes) +
			"|" + fmt.Sprintf("`max_connections` (¾ of the file limit, at most %s", thousands(httpserve.MaxDefaultConnections)),
	}
	for section, ps := range phrases {
		for _, p := range strings.Split(ps, "|") {
			assert.Contains(t, doc[section], p, "docs/configuration.md, %s", section)
		}
	}
	require.Equal(t, int64(0), cfg.API.MaxBodyBytesInFlight%cfg.API.MaxBodyBytes, "max_body_bytes_in_flight is a multiple of max_body_bytes")
}

func onOff(b bool) string {
	if b {
		return "on"
	}
	return "off"
}

func or(v, def string) string {
	if v == "" {
		return def
	}
	return v
}

// days writes periods that are all one whole number of days as the doc does ("7d").
func days(t *testing.T, ps ...config.Period) string {
	t.Helper()
	d := ps[0].Duration()
	for _, p := range ps {
		require.Equal(t, d, p.Duration(), "periods written as one differ")
	}
	require.Zero(t, d%(24*time.Hour), "%s is not whole days", d)
	return fmt.Sprintf("%dd", d/(24*time.Hour))
}

// thousands writes n with commas between groups of three digits, as the docs write numbers.
func thousands(n int) string {
	s := strconv.Itoa(n)
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}

// TestExampleConfigs_Load: every example file of configs/ loads and validates, and the files it
// names (keys, the stream key) are there: read, for a file that names them from the repository
// (make run); in configs/, for one that names them where the Dockerfile copies configs/
// (/etc/llmq/, docker compose).
func TestExampleConfigs_Load(t *testing.T) {
	t.Chdir("../..") // the files they name are relative to the repository
	noEnv := func(string) string { return "" }
	dockerfile, err := os.ReadFile("Dockerfile")
	require.NoError(t, err)
	const imageDir = "/etc/llmq/"
	require.Contains(t, string(dockerfile), "COPY configs/ "+imageDir)

	paths, err := filepath.Glob("configs/*.yaml")
	require.NoError(t, err)
	require.NotEmpty(t, paths)
	for _, p := range paths {
		cfg, err := config.LoadWithoutSecrets(p, noEnv)
		require.NoError(t, err, p)
		named := []string{cfg.API.StreamSecretFile}
		for _, cr := range cfg.Credentials {
			named = append(named, cr.APIKeyFile)
		}
		inImage := false
		for _, f := range named {
			if f == "" {
				continue
			}
			if rest, ok := strings.CutPrefix(f, imageDir); ok {
				inImage = true
				f = filepath.Join("configs", rest)
			}
			_, err := os.Stat(f)
			assert.NoError(t, err, "%s names %s", p, f)
		}
		if inImage {
			continue // its keys are read in the image, from the same files
		}
		cfg, err = config.Load(p, noEnv)
		require.NoError(t, err, p)
		_, err = cfg.API.StreamSecret()
		assert.NoError(t, err, "%s: the API would refuse its stream key", p)
	}
}
