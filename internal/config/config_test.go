package config_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/llmq/llmq/internal/config"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// secret is the value every fake environment variable holds; no error may ever contain it.
const secret = "sk-test-DO-NOT-LEAK-0123456789"

// designExample is the configuration contract's example file, verbatim.
const designExample = `database_url: postgres://postgres@127.0.0.1:5432/llmq?sslmode=disable
redis_url: redis://127.0.0.1:6379/0
api:    { listen: 127.0.0.1:8080, allow_anonymous: true }   # no bearer token → tenant ` + "`default`" + ` (dev only)
worker: { concurrency: 200, metrics_listen: 127.0.0.1:9091 }
credentials:
  - name: default
    provider: anthropic            # anthropic | openai
    base_url: http://127.0.0.1:8090
    api_key_env: ANTHROPIC_API_KEY
    limits: { requests_per_second: 10, burst: 20 }   # optional: learned from responses when absent
retry: { max_attempts: 10, base_delay: 500ms, max_delay: 60s }
alerts: { webhook_url: "" }
`

// env returns a getenv func backed by vars.
func env(vars map[string]string) func(string) string {
	return func(k string) string { return vars[k] }
}

// secretEnv answers every variable but llmq's own with the secret, so that a leak shows in any
// error.
func secretEnv(k string) string {
	if strings.HasPrefix(k, "LLMQ_") {
		return ""
	}
	return secret
}

// minimal returns a valid file with one credential whose body lines are cred (indented under
// "- "), followed by extra top-level YAML.
func minimal(cred, extra string) []byte {
	return []byte("credentials:\n  - " + strings.ReplaceAll(strings.TrimSpace(cred), "\n", "\n    ") + "\n" + extra)
}

const goodCred = `name: default
provider: anthropic
base_url: http://127.0.0.1:8090
api_key_env: ANTHROPIC_API_KEY`

func TestParse_DesignExample(t *testing.T) {
	t.Parallel()

	cfg, err := config.Parse([]byte(designExample), env(map[string]string{"ANTHROPIC_API_KEY": secret}))
	require.NoError(t, err)

	require.Equal(t, "postgres://postgres@127.0.0.1:5432/llmq?sslmode=disable", cfg.DatabaseURL)
	require.Equal(t, "redis://127.0.0.1:6379/0", cfg.RedisURL)
	require.Equal(t, "127.0.0.1:8080", cfg.API.Listen)
	require.True(t, cfg.API.AllowAnonymous)
	require.Equal(t, int64(4<<20), cfg.API.MaxBodyBytes, "default max_body_bytes")
	require.Equal(t, 200, cfg.Worker.Concurrency)
	require.Equal(t, "127.0.0.1:9091", cfg.Worker.MetricsListen)
	require.Equal(t, "llmq", cfg.Worker.Queue, "default queue")
	require.Equal(t, 10*time.Second, cfg.Worker.SweepInterval, "default sweep_interval")
	require.Equal(t, config.Retry{MaxAttempts: 10, BaseDelay: 500 * time.Millisecond, MaxDelay: 60 * time.Second, MaxRetryAfter: 5 * time.Minute}, cfg.Retry)
	require.Empty(t, cfg.Alerts.WebhookURL)

	require.Len(t, cfg.Credentials, 1)
	cr, ok := cfg.Credential("default")
	require.True(t, ok)
	require.Equal(t, "anthropic", cr.Provider)
	require.Equal(t, "http://127.0.0.1:8090", cr.BaseURL)
	require.Equal(t, "ANTHROPIC_API_KEY", cr.APIKeyEnv)
	require.Equal(t, &config.Limits{RequestsPerSecond: 10, Burst: 20}, cr.Limits)
	require.Equal(t, 5*time.Minute, cr.AttemptTimeout, "default attempt_timeout")
	require.Equal(t, secret, cr.APIKey())

	_, ok = cfg.Credential("nope")
	require.False(t, ok)
}

func TestParse_Defaults(t *testing.T) {
	t.Parallel()

	cfg, err := config.Parse(minimal(goodCred, ""), secretEnv)
	require.NoError(t, err)
	require.Equal(t, config.DefaultDatabaseURL, cfg.DatabaseURL)
	require.Equal(t, config.DefaultRedisURL, cfg.RedisURL)
	require.Equal(t, "127.0.0.1:8080", cfg.API.Listen)
	require.False(t, cfg.API.AllowAnonymous)
	require.Equal(t, int64(4<<20), cfg.API.MaxBodyBytes)
	require.Equal(t, 10*time.Second, cfg.API.StoreTimeout)
	require.Equal(t, config.Worker{Concurrency: 200, MetricsListen: "127.0.0.1:9091", Queue: "llmq", SweepInterval: 10 * time.Second,
		PollInterval: 100 * time.Millisecond, MaxAnswerBytes: 256 << 20, PhaseMargin: 100 * time.Millisecond, BacklogSteps: 8}, cfg.Worker)
	require.Equal(t, config.Retry{MaxAttempts: 10, BaseDelay: 500 * time.Millisecond, MaxDelay: 60 * time.Second, MaxRetryAfter: 5 * time.Minute}, cfg.Retry)
	require.Nil(t, cfg.Credentials[0].Limits, "absent limits stay nil: they are learned")
	require.Equal(t, 5*time.Minute, cfg.Credentials[0].AttemptTimeout)
	require.Equal(t, config.Breaker{}, cfg.Breaker, "nothing set: the breaker's own defaults apply")
	require.True(t, cfg.Breaker.ColdStart(), "the cold-start cap is on by default")
}

func TestParse_BreakerColdStartCapOff(t *testing.T) {
	t.Parallel()
	cfg, err := config.Parse(minimal(goodCred, "breaker: { cold_start_cap: false }\n"), secretEnv)
	require.NoError(t, err)
	require.False(t, cfg.Breaker.ColdStart())
	_, err = config.Parse(minimal(goodCred, "breaker: { max_cooldown: 1s }\n"), secretEnv)
	require.ErrorContains(t, err, "breaker.max_cooldown", "below the default cooldown")
}

// TestParse_PhaseMarginZeroTakesTheDefault pins what docs/configuration.md says of
// worker.phase_margin: a written 0 takes the default, as an absent one does (the limiter reads 0
// as "unset"), and the smallest margin one can write, 1ns, is kept.
func TestParse_PhaseMarginZeroTakesTheDefault(t *testing.T) {
	t.Parallel()
	for margin, want := range map[string]time.Duration{"0s": config.DefaultPhaseMargin, "1ns": time.Nanosecond} {
		cfg, err := config.Parse(minimal(goodCred, "worker: { phase_margin: "+margin+" }\n"), secretEnv)
		require.NoError(t, err, margin)
		require.Equal(t, want, cfg.Worker.PhaseMargin, margin)
	}
}

func TestParse_ExplicitValuesKept(t *testing.T) {
	t.Parallel()

	cfg, err := config.Parse(minimal(goodCred+"\nattempt_timeout: 90s", `
api: { listen: ":9000", max_body_bytes: 1024 }
worker: { concurrency: 3, metrics_listen: "off", queue: q1, sweep_interval: 2s, poll_interval: 5ms, max_answer_bytes: 67108864, phase_margin: 300ms, backlog_steps: 3 }
retry: { max_attempts: 4, base_delay: 1s, max_delay: 1s, max_retry_after: 90s }
alerts: { webhook_url: "https://hooks.example/x" }
`), secretEnv)
	require.NoError(t, err)
	require.Equal(t, ":9000", cfg.API.Listen)
	require.Equal(t, int64(1024), cfg.API.MaxBodyBytes)
	require.Equal(t, config.Worker{Concurrency: 3, MetricsListen: "off", Queue: "q1", SweepInterval: 2 * time.Second,
		PollInterval: 5 * time.Millisecond, MaxAnswerBytes: 64 << 20, PhaseMargin: 300 * time.Millisecond, BacklogSteps: 3}, cfg.Worker)
	require.Equal(t, config.Retry{MaxAttempts: 4, BaseDelay: time.Second, MaxDelay: time.Second, MaxRetryAfter: 90 * time.Second}, cfg.Retry)
	require.Equal(t, "https://hooks.example/x", cfg.Alerts.WebhookURL)
	require.Equal(t, 90*time.Second, cfg.Credentials[0].AttemptTimeout)
}

func TestParse_RedisURLForms(t *testing.T) {
	t.Parallel()

	for _, u := range []string{
		"redis://127.0.0.1:6379/0",
		"rediss://user:pw@redis.example:6380/1",
		"redis-socket:///run/redis.sock",
		"redis-sentinel://127.0.0.1:26379?master=mymaster",
		"redis-cluster://10.0.0.1:6379,10.0.0.2:6379",
	} {
		t.Run(u, func(t *testing.T) {
			t.Parallel()
			cfg, err := config.Parse(minimal(goodCred, "redis_url: "+u+"\n"), secretEnv)
			require.NoError(t, err)
			require.Equal(t, u, cfg.RedisURL)
		})
	}
}

func TestParse_EnvOverrides(t *testing.T) {
	t.Parallel()

	const (
		db    = "postgres://postgres@db.example:5432/other?sslmode=disable"
		redis = "redis://redis.example:6379/3"
	)
	vars := map[string]string{
		config.EnvDatabaseURL: db,
		config.EnvRedisURL:    redis,
		"ANTHROPIC_API_KEY":   secret,
	}

	t.Run("OverrideFile", func(t *testing.T) {
		t.Parallel()
		cfg, err := config.Parse([]byte(designExample), env(vars))
		require.NoError(t, err)
		require.Equal(t, db, cfg.DatabaseURL)
		require.Equal(t, redis, cfg.RedisURL)
	})

	t.Run("OverrideDefaults", func(t *testing.T) {
		t.Parallel()
		cfg, err := config.Parse(minimal(goodCred, ""), env(vars))
		require.NoError(t, err)
		require.Equal(t, db, cfg.DatabaseURL)
		require.Equal(t, redis, cfg.RedisURL)
	})

	t.Run("EmptyMeansUnset", func(t *testing.T) {
		t.Parallel()
		cfg, err := config.Parse([]byte(designExample), env(map[string]string{
			config.EnvDatabaseURL: "", config.EnvRedisURL: "", "ANTHROPIC_API_KEY": secret,
		}))
		require.NoError(t, err)
		require.Equal(t, "postgres://postgres@127.0.0.1:5432/llmq?sslmode=disable", cfg.DatabaseURL)
		require.Equal(t, "redis://127.0.0.1:6379/0", cfg.RedisURL)
	})

	t.Run("OverrideIsValidated", func(t *testing.T) {
		t.Parallel()
		_, err := config.Parse([]byte(designExample), env(map[string]string{
			config.EnvDatabaseURL: "mysql://x/y", config.EnvRedisURL: "http://x", "ANTHROPIC_API_KEY": secret,
		}))
		require.Error(t, err)
		require.Contains(t, err.Error(), "database_url")
		require.Contains(t, err.Error(), "redis_url")
	})
}

func TestLoad(t *testing.T) {
	t.Parallel()

	t.Run("OK", func(t *testing.T) {
		t.Parallel()
		path := filepath.Join(t.TempDir(), "llmq.yaml")
		require.NoError(t, os.WriteFile(path, []byte(designExample), 0o600))
		cfg, err := config.Load(path, env(map[string]string{"ANTHROPIC_API_KEY": secret}))
		require.NoError(t, err)
		require.Equal(t, secret, cfg.Credentials[0].APIKey())
	})

	t.Run("MissingFileNamesPath", func(t *testing.T) {
		t.Parallel()
		path := filepath.Join(t.TempDir(), "nowhere", "llmq.yaml")
		_, err := config.Load(path, secretEnv)
		require.Error(t, err)
		require.Contains(t, err.Error(), path)
		require.Contains(t, err.Error(), "not found")
	})

	t.Run("NoPath", func(t *testing.T) {
		t.Parallel()
		_, err := config.Load("", secretEnv)
		require.Error(t, err)
		require.Contains(t, err.Error(), config.EnvConfig)
	})

	t.Run("InvalidFileNamesPathAndField", func(t *testing.T) {
		t.Parallel()
		path := filepath.Join(t.TempDir(), "bad.yaml")
		require.NoError(t, os.WriteFile(path, minimal(goodCred, "retry: { max_attempts: -1 }\n"), 0o600))
		_, err := config.Load(path, secretEnv)
		require.Error(t, err)
		require.Contains(t, err.Error(), path)
		require.Contains(t, err.Error(), "retry.max_attempts")
		require.NotContains(t, err.Error(), secret)
	})
}

func TestParse_UnknownField(t *testing.T) {
	t.Parallel()

	for name, doc := range map[string][]byte{
		"TopLevel":     minimal(goodCred, "databse_url: postgres://x/y\n"),
		"Nested":       minimal(goodCred, "worker: { concurency: 4 }\n"),
		"InCredential": minimal(goodCred+"\napi_key: "+secret, ""),
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			_, err := config.Parse(doc, secretEnv)
			require.Error(t, err)
			require.Contains(t, err.Error(), "unknown key")
			// A key pasted into the file by mistake is not echoed back.
			require.NotContains(t, err.Error(), secret)
		})
	}
}

func TestParse_InvalidYAML(t *testing.T) {
	t.Parallel()

	_, err := config.Parse([]byte("credentials: [\n"), secretEnv)
	require.Error(t, err)
	require.Contains(t, err.Error(), "parse yaml")
}

func TestParse_Empty(t *testing.T) {
	t.Parallel()

	_, err := config.Parse(nil, secretEnv)
	require.Error(t, err)
	require.Contains(t, err.Error(), "credentials")
}

// TestParse_Validation checks that each invalid file fails with an error naming the field. The
// environment answers every variable with the secret, which must never appear in an error.
func TestParse_Validation(t *testing.T) {
	t.Parallel()

	cases := []struct {
		name  string
		doc   []byte
		field string
	}{
		{"NoCredentials", []byte("credentials: []\n"), "credentials: at least one"},
		{"ProviderUnknown", minimal(strings.Replace(goodCred, "anthropic", "gemini", 1), ""), "credentials[0].provider"},
		{"ProviderMissing", minimal("name: a\nbase_url: http://x\napi_key_env: K", ""), "credentials[0].provider"},
		{"BaseURLMissing", minimal("name: a\nprovider: openai\napi_key_env: K", ""), "credentials[0].base_url"},
		{"BaseURLRelative", minimal(strings.Replace(goodCred, "http://127.0.0.1:8090", "/v1", 1), ""), "credentials[0].base_url"},
		{"BaseURLScheme", minimal(strings.Replace(goodCred, "http://", "ftp://", 1), ""), "credentials[0].base_url"},
		// What the provider client refuses at start is refused here, named as the file's field.
		{"BaseURLCredentials", minimal(strings.Replace(goodCred, "http://", "http://user:"+secret+"@", 1), ""), "credentials[0].base_url: must not hold credentials"},
		{"BaseURLQuery", minimal(strings.Replace(goodCred, ":8090", ":8090/?beta=1", 1), ""), "credentials[0].base_url: must not have a query or fragment"},
		{"BaseURLEmptyQuery", minimal(strings.Replace(goodCred, ":8090", ":8090/?", 1), ""), "credentials[0].base_url: must not have a query or fragment"},
		{"BaseURLFragment", minimal(strings.Replace(goodCred, ":8090", ":8090#v1", 1), ""), "credentials[0].base_url: must not have a query or fragment"},
		{"NameMissing", minimal("provider: openai\nbase_url: http://x\napi_key_env: K", ""), "credentials[0].name"},
		{"NameBad", minimal(strings.Replace(goodCred, "name: default", "name: has space", 1), ""), "credentials[0].name"},
		{"NameDuplicate", []byte("credentials:\n" +
			"  - { name: a, provider: openai, base_url: 'http://x', api_key_env: K }\n" +
			"  - { name: a, provider: anthropic, base_url: 'http://y', api_key_env: K }\n"), "credentials[1].name: duplicate"},
		{"KeyNeither", minimal("name: a\nprovider: openai\nbase_url: http://x", ""), "credentials[0]: exactly one of api_key_env and api_key_file"},
		{"KeyBoth", minimal(goodCred+"\napi_key_file: /run/secrets/k", ""), "credentials[0]: exactly one of api_key_env and api_key_file"},
		{"KeyEnvNotAName", minimal(strings.Replace(goodCred, "ANTHROPIC_API_KEY", secret, 1), ""), "credentials[0].api_key_env"},
		{"LimitsRateZero", minimal(goodCred+"\nlimits: { requests_per_second: 0, burst: 5 }", ""), "credentials[0].limits"},
		{"LimitsRateNegative", minimal(goodCred+"\nlimits: { requests_per_second: -1, burst: 5 }", ""), "credentials[0].limits"},
		{"LimitsBurstZero", minimal(goodCred+"\nlimits: { requests_per_second: 5, burst: 0 }", ""), "credentials[0].limits"},
		{"LimitsEmpty", minimal(goodCred+"\nlimits: {}", ""), "credentials[0].limits"},
		{"LimitsRateInfinite", minimal(goodCred+"\nlimits: { requests_per_second: .inf, burst: 5 }", ""), "credentials[0].limits"},
		{"LimitsRateNaN", minimal(goodCred+"\nlimits: { requests_per_second: .nan, burst: 5 }", ""), "credentials[0].limits"},
		{"LimitsTokensNaN", minimal(goodCred+"\nlimits: { requests_per_second: 5, burst: 5, input_tokens_per_minute: .nan }", ""), "credentials[0].limits"},
		{"LimitsTokensInfinite", minimal(goodCred+"\nlimits: { requests_per_second: 5, burst: 5, tokens_per_minute: .inf }", ""), "credentials[0].limits"},
		{"SubmitRateInfinite", minimal(goodCred, "api: { tenant_submit_rate: { requests_per_second: .inf, burst: 5 } }\n"), "api.tenant_submit_rate"},
		{"TokenMinuteBelowASecond", minimal(goodCred, "worker: { token_minute: 500ms }\n"), "worker.token_minute"},
		{"AttemptTimeoutNegative", minimal(goodCred+"\nattempt_timeout: -1s", ""), "credentials[0].attempt_timeout"},
		{"SecondCredentialIndexed", []byte("credentials:\n" +
			"  - { name: a, provider: openai, base_url: 'http://x', api_key_env: K }\n" +
			"  - { name: b, provider: openai, base_url: 'nope', api_key_env: K }\n"), "credentials[1].base_url"},
		{"RetryMaxDelayBelowBase", minimal(goodCred, "retry: { base_delay: 2s, max_delay: 1s }\n"), "retry.max_delay"},
		{"RetryMaxDelayBelowDefaultBase", minimal(goodCred, "retry: { max_delay: 100ms }\n"), "retry.max_delay"},
		{"RetryMaxRetryAfterBelowASecond", minimal(goodCred, "retry: { max_retry_after: 500ms }\n"), "retry.max_retry_after"},
		{"RetryMaxRetryAfterNegative", minimal(goodCred, "retry: { max_retry_after: -1m }\n"), "retry.max_retry_after"},
		{"RetryMaxRetryAfterAboveAnHour", minimal(goodCred, "retry: { max_retry_after: 2h }\n"), "retry.max_retry_after"},
		{"RetryBaseNegative", minimal(goodCred, "retry: { base_delay: -1s }\n"), "retry.base_delay"},
		{"RetryAttemptsNegative", minimal(goodCred, "retry: { max_attempts: -1 }\n"), "retry.max_attempts"},
		{"RetryAttemptsTooMany", minimal(goodCred, "retry: { max_attempts: 101 }\n"), "retry.max_attempts"},
		{"WebhookScheme", minimal(goodCred, "alerts: { webhook_url: 'ftp://hooks.example/x' }\n"), "alerts.webhook_url"},
		{"WebhookNoScheme", minimal(goodCred, "alerts: { webhook_url: 'hooks.example/x' }\n"), "alerts.webhook_url"},
		{"WebhookNoHost", minimal(goodCred, "alerts: { webhook_url: 'http://' }\n"), "alerts.webhook_url"},
		{"WebhookEmptyHost", minimal(goodCred, "alerts: { webhook_url: 'https:///hooks/alert' }\n"), "alerts.webhook_url"},
		{"WebhookOpaque", minimal(goodCred, "alerts: { webhook_url: 'https:hooks.example.com/x' }\n"), "alerts.webhook_url"},
		{"DatabaseScheme", minimal(goodCred, "database_url: mysql://127.0.0.1/llmq\n"), "database_url"},
		{"DatabaseUnparsable", minimal(goodCred, "database_url: 'postgres://u:%zz@h/db'\n"), "database_url"},
		{"RedisScheme", minimal(goodCred, "redis_url: http://127.0.0.1:6379\n"), "redis_url"},
		{"RedisLookalikeScheme", minimal(goodCred, "redis_url: redisx://127.0.0.1:6379\n"), "redis_url"},
		{"MaxBodyNegative", minimal(goodCred, "api: { max_body_bytes: -1 }\n"), "api.max_body_bytes"},
		{"StoreTimeoutPastWriteTimeout", minimal(goodCred, "api: { store_timeout: 30s }\n"), "api.store_timeout"},
		{"StoreTimeoutNegative", minimal(goodCred, "api: { store_timeout: -1s }\n"), "api.store_timeout"},
		{"ConcurrencyNegative", minimal(goodCred, "worker: { concurrency: -1 }\n"), "worker.concurrency"},
		{"SweepNegative", minimal(goodCred, "worker: { sweep_interval: -1s }\n"), "worker.sweep_interval"},
		{"SweepTooRare", minimal(goodCred, "worker: { sweep_interval: 6m }\n"), "worker.sweep_interval"},
		{"PollNegative", minimal(goodCred, "worker: { poll_interval: -1ms }\n"), "worker.poll_interval"},
		{"PollBelowAMillisecond", minimal(goodCred, "worker: { poll_interval: 500us }\n"), "worker.poll_interval"},
		{"PhaseMarginNegative", minimal(goodCred, "worker: { phase_margin: -1ms }\n"), "worker.phase_margin"},
		{"PhaseMarginAboveFiveSeconds", minimal(goodCred, "worker: { phase_margin: 6s }\n"), "worker.phase_margin"},
		{"BacklogStepsNegative", minimal(goodCred, "worker: { backlog_steps: -1 }\n"), "worker.backlog_steps"},
		{"MaxAnswerBytesBelowOneAnswer", minimal(goodCred, "worker: { max_answer_bytes: 1048576 }\n"), "worker.max_answer_bytes"},
		{"MaxAnswerBytesNegative", minimal(goodCred, "worker: { max_answer_bytes: -1 }\n"), "worker.max_answer_bytes"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			cfg, err := config.Parse(tc.doc, secretEnv)
			require.Error(t, err)
			require.Nil(t, cfg)
			require.Contains(t, err.Error(), tc.field)
			require.NotContains(t, err.Error(), secret)
		})
	}
}

func TestParse_ReportsEveryInvalidField(t *testing.T) {
	t.Parallel()

	_, err := config.Parse(minimal("name: a\nprovider: x\nbase_url: y\napi_key_env: K",
		"redis_url: tcp://x\nretry: { max_attempts: 500 }\n"), secretEnv)
	require.Error(t, err)
	for _, f := range []string{"redis_url", "retry.max_attempts", "credentials[0].provider", "credentials[0].base_url"} {
		require.Contains(t, err.Error(), f)
	}
}

func TestParse_APIKeyEnv(t *testing.T) {
	t.Parallel()

	t.Run("Unset", func(t *testing.T) {
		t.Parallel()
		doc := []byte("credentials:\n" +
			"  - { name: a, provider: openai, base_url: 'http://x', api_key_env: OPENAI_KEY }\n" +
			"  - { name: b, provider: anthropic, base_url: 'http://y', api_key_env: MISSING_KEY }\n")
		_, err := config.Parse(doc, env(map[string]string{"OPENAI_KEY": secret}))
		require.Error(t, err)
		require.Contains(t, err.Error(), "credentials[1].api_key_env")
		require.Contains(t, err.Error(), "MISSING_KEY")
		require.NotContains(t, err.Error(), secret)
	})

	t.Run("Resolved", func(t *testing.T) {
		t.Parallel()
		doc := []byte("credentials:\n" +
			"  - { name: a, provider: openai, base_url: 'http://x', api_key_env: OPENAI_KEY }\n" +
			"  - { name: b, provider: anthropic, base_url: 'http://y', api_key_env: ANTHROPIC_KEY }\n")
		cfg, err := config.Parse(doc, env(map[string]string{"OPENAI_KEY": "k-openai", "ANTHROPIC_KEY": "k-anthropic"}))
		require.NoError(t, err)
		a, ok := cfg.Credential("a")
		require.True(t, ok)
		require.Equal(t, "k-openai", a.APIKey())
		b, ok := cfg.Credential("b")
		require.True(t, ok)
		require.Equal(t, "k-anthropic", b.APIKey())
	})

	t.Run("SecretNotInConfigPrint", func(t *testing.T) {
		t.Parallel()
		cfg, err := config.Parse(minimal(goodCred, ""), secretEnv)
		require.NoError(t, err)
		// The key is unexported: printing the config (as a debug log might) does not show it.
		require.NotContains(t, fmt.Sprintf("%v %+v %#v %+v", cfg, *cfg, *cfg, cfg.Credentials[0]), secret)
	})
}

func TestParse_APIKeyFile(t *testing.T) {
	t.Parallel()

	credWithFile := func(path string) []byte {
		return minimal(fmt.Sprintf("name: a\nprovider: openai\nbase_url: http://x\napi_key_file: %q", path), "")
	}

	t.Run("ReadAndTrimmed", func(t *testing.T) {
		t.Parallel()
		path := filepath.Join(t.TempDir(), "key")
		require.NoError(t, os.WriteFile(path, []byte("  \t"+secret+"\r\n\n"), 0o600))
		cfg, err := config.Parse(credWithFile(path), env(nil))
		require.NoError(t, err)
		require.Equal(t, secret, cfg.Credentials[0].APIKey())
	})

	t.Run("Missing", func(t *testing.T) {
		t.Parallel()
		path := filepath.Join(t.TempDir(), "absent")
		_, err := config.Parse(credWithFile(path), secretEnv)
		require.Error(t, err)
		require.Contains(t, err.Error(), "credentials[0].api_key_file")
		require.Contains(t, err.Error(), path)
		require.NotContains(t, err.Error(), secret)
	})

	t.Run("Empty", func(t *testing.T) {
		t.Parallel()
		path := filepath.Join(t.TempDir(), "key")
		require.NoError(t, os.WriteFile(path, []byte(" \n\t\n"), 0o600))
		_, err := config.Parse(credWithFile(path), secretEnv)
		require.Error(t, err)
		require.Contains(t, err.Error(), "credentials[0].api_key_file")
		require.Contains(t, err.Error(), "empty")
	})

	t.Run("Directory", func(t *testing.T) {
		t.Parallel()
		dir := t.TempDir()
		_, err := config.Parse(credWithFile(dir), secretEnv)
		require.Error(t, err)
		require.Contains(t, err.Error(), "credentials[0].api_key_file")
		require.NotContains(t, err.Error(), secret)
	})
}

func TestLoadWithoutSecrets(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "llmq.yaml")
	require.NoError(t, os.WriteFile(path, []byte(`
credentials:
  - { name: main, provider: anthropic, base_url: "https://api.anthropic.com", api_key_env: LLMQ_TEST_UNSET_KEY }
`), 0o600))
	noEnv := func(string) string { return "" }

	_, err := config.Load(path, noEnv)
	require.ErrorContains(t, err, "LLMQ_TEST_UNSET_KEY is not set")

	cfg, err := config.LoadWithoutSecrets(path, noEnv)
	require.NoError(t, err)
	main, ok := cfg.Credential("main")
	require.True(t, ok)
	require.Empty(t, main.APIKey())
}

func TestParse_StreamSecret(t *testing.T) {
	t.Parallel()
	key := strings.Repeat("k", config.MinStreamSecretBytes)
	dir := t.TempDir()
	file := filepath.Join(dir, "stream.secret")
	require.NoError(t, os.WriteFile(file, []byte(key+"\n"), 0o600))
	short := filepath.Join(dir, "short.secret")
	require.NoError(t, os.WriteFile(short, []byte(secret[:10]), 0o600))

	for name, tc := range map[string]struct {
		api     string
		want    string // the key; "" for none
		loadErr string // an error of the API's alone (StreamSecret)
	}{
		"None":       {api: `{}`},
		"Env":        {api: `{stream_secret_env: STREAM_KEY}`, want: key},
		"File":       {api: fmt.Sprintf(`{stream_secret_file: %q}`, file), want: key},
		"EnvUnset":   {api: `{stream_secret_env: LLMQ_UNSET}`, loadErr: "LLMQ_UNSET is not set"},
		"FileAbsent": {api: fmt.Sprintf(`{stream_secret_file: %q}`, file+".x"), loadErr: "cannot read"},
		"TooShort":   {api: fmt.Sprintf(`{stream_secret_file: %q}`, short), loadErr: "want at least 32"},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			cfg, err := config.Parse(minimal(goodCred, "api: "+tc.api+"\n"), func(k string) string {
				if k == "STREAM_KEY" {
					return key
				}
				return secretEnv(k)
			})
			require.NoError(t, err, "only the API fails on its own secret")
			require.Equal(t, 10*time.Minute, cfg.API.StreamURLTTL)
			got, err := cfg.API.StreamSecret()
			if tc.loadErr != "" {
				require.ErrorContains(t, err, tc.loadErr)
				require.NotContains(t, err.Error(), secret[:10])
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.want, string(got))
			if tc.want == "" {
				return
			}
			// Printed, the config shows no key (it signs every job's events_url).
			for _, verb := range []string{"%v", "%+v", "%#v", "%s"} {
				for _, v := range []any{*cfg, cfg.API} {
					out := fmt.Sprintf(verb, v)
					require.NotContains(t, out, key, verb)
					require.NotContains(t, out, "107 107 107", "%s: the key's bytes", verb)
				}
			}
		})
	}

	for name, api := range map[string]string{
		"Both":       fmt.Sprintf(`{stream_secret_env: K, stream_secret_file: %q}`, file),
		"EnvHoldsIt": `{stream_secret_env: "` + key + `-"}`,
		"NegTTL":     `{stream_url_ttl: -1s}`,
	} {
		_, err := config.Parse(minimal(goodCred, "api: "+api+"\n"), secretEnv)
		require.Error(t, err, name)
		require.NotContains(t, err.Error(), key, name)
	}
}

// TestParse_BadBaseURLHidesItsPassword: an invalid base_url (a proxy's, with a user and
// password in it) is refused naming the field, without its password: the error of a config
// goes to every process's log. Before, it was quoted whole.
func TestParse_BadBaseURLHidesItsPassword(t *testing.T) {
	t.Parallel()
	for _, u := range []string{
		"ftp://proxyuser:hunter2secret@proxy:8080",     // parses; wrong scheme
		"//proxyuser:hunter2secret@proxy:8080/v1",      // parses; not absolute
		"http://proxyuser:hunter2secret@proxy:80 80",   // does not parse
		"http://proxyuser:hunter2secret%zz@proxy:8080", // does not parse
	} {
		doc := minimal(strings.Replace(goodCred, "http://127.0.0.1:8090", "'"+u+"'", 1), "")
		_, err := config.Parse(doc, secretEnv)
		require.ErrorContains(t, err, "credentials[0].base_url", u)
		require.NotContains(t, err.Error(), "hunter2secret", u)
	}
}

// A max_cooldown is held to the cooldown in force, as the breaker holds it: the one written, or,
// with none, the breaker's default (2s). A fast breaker (cooldown 100ms) may cap at 1s.
func TestParse_BreakerMaxCooldownAtLeastTheCooldown(t *testing.T) {
	t.Parallel()
	cfg, err := config.Parse(minimal(goodCred, "breaker: { cooldown: 100ms, max_cooldown: 1s }\n"), secretEnv)
	require.NoError(t, err)
	require.Equal(t, time.Second, cfg.Breaker.MaxCooldown)
	_, err = config.Parse(minimal(goodCred, "breaker: { cooldown: 3s, max_cooldown: 2s }\n"), secretEnv)
	require.ErrorContains(t, err, "breaker.max_cooldown")
}
