package config_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/config"
)

// The cases of this file are what a careless operator writes: each must fail at start, naming
// the field and the problem, rather than run with a setting that spins, hides half the file or
// lifts a safety.

func TestParse_SecondDocumentRefused(t *testing.T) {
	t.Parallel()

	// Two files pasted together: the second's settings were silently dropped.
	doc := append(minimal(goodCred, ""), []byte("---\nworker: { concurrency: 5 }\n")...)
	_, err := config.Parse(doc, secretEnv)
	require.ErrorContains(t, err, "second YAML document")

	// A trailing "---" or a comment-only document holds nothing to lose.
	for _, tail := range []string{"---\n", "---\n# nothing\n"} {
		_, err := config.Parse(append(minimal(goodCred, ""), tail...), secretEnv)
		require.NoError(t, err, "%q", tail)
	}
}

func TestParse_BOMAndCRLFRead(t *testing.T) {
	t.Parallel()

	// Files saved by Windows editors: read as written, not refused.
	doc := append([]byte("\xef\xbb\xbf"), strings.ReplaceAll(string(minimal(goodCred, "worker: { concurrency: 7 }\n")), "\n", "\r\n")...)
	cfg, err := config.Parse(doc, secretEnv)
	require.NoError(t, err)
	require.Equal(t, 7, cfg.Worker.Concurrency)
	require.Equal(t, "default", cfg.Credentials[0].Name)
}

func TestParse_IntervalsThatWouldSpin(t *testing.T) {
	t.Parallel()

	for name, tc := range map[string]struct{ doc []byte }{
		"worker.sweep_interval":               {minimal(goodCred, "worker: { sweep_interval: 1ns }\n")},
		"worker.sweep_interval: must be":      {minimal(goodCred, "worker: { sweep_interval: 50ms }\n")},
		"retention.interval":                  {minimal(goodCred, "retention: { interval: 1ns }\n")},
		"credentials[0].pause_probe_interval": {minimal(goodCred+"\npause_probe_interval: 1ms", "")},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			_, err := config.Parse(tc.doc, secretEnv)
			require.ErrorContains(t, err, strings.TrimSuffix(name, ": must be")+": must be")
		})
	}

	cfg, err := config.Parse(minimal(goodCred+"\npause_probe_interval: 100ms", "worker: { sweep_interval: 100ms }\nretention: { interval: 100ms }\n"), secretEnv)
	require.NoError(t, err)
	require.Equal(t, "100ms", cfg.Credentials[0].PauseProbeInterval.String())
}

func TestParse_OnlineFallbackWithinWindow(t *testing.T) {
	t.Parallel()

	// A fallback as long as the window sends every batch-lane job online as it is submitted.
	for _, b := range []string{"online_fallback: 48h", "window: 1h, online_fallback: 1h"} {
		_, err := config.Parse(minimal(goodCred+"\nbatch: { enabled: true, "+b+" }", ""), secretEnv)
		require.ErrorContains(t, err, "credentials[0].batch.online_fallback: must be less than", b)
	}
}

// twoCreds is a file with two credentials of one provider and base URL, keys and limits given.
func twoCreds(keyA, keyB, limitsA, limitsB string) []byte {
	return []byte("credentials:\n" +
		"  - { name: a, provider: openai, base_url: 'http://x', " + keyA + limitsA + " }\n" +
		"  - { name: b, provider: openai, base_url: 'http://x', " + keyB + limitsB + " }\n")
}

func TestParse_SharedKeyNeedsOneLimit(t *testing.T) {
	t.Parallel()

	const (
		slow = ", limits: { requests_per_second: 5, burst: 5 }"
		fast = ", limits: { requests_per_second: 50, burst: 50 }"
	)
	vars := env(map[string]string{"K": secret, "K2": secret, "OTHER": "sk-other"})

	t.Run("SameVariable", func(t *testing.T) {
		t.Parallel()
		for _, limits := range [][2]string{{slow, fast}, {slow, ""}, {"", fast}} {
			doc := twoCreds("api_key_env: K", "api_key_env: K", limits[0], limits[1])
			for _, parse := range []func([]byte, func(string) string) (*config.Config, error){config.Parse, parseWithoutSecrets(t)} {
				_, err := parse(doc, vars)
				require.ErrorContains(t, err, `credentials[1].limits: "b" uses the same key as "a" (credentials[0]) with other limits`)
				require.NotContains(t, err.Error(), secret)
			}
		}
	})

	t.Run("TwoVariablesOneKey", func(t *testing.T) {
		t.Parallel()
		_, err := config.Parse(twoCreds("api_key_env: K", "api_key_env: K2", slow, fast), vars)
		require.ErrorContains(t, err, "credentials[1].limits")
		require.NotContains(t, err.Error(), secret)
	})

	t.Run("Allowed", func(t *testing.T) {
		t.Parallel()
		for _, doc := range [][]byte{
			twoCreds("api_key_env: K", "api_key_env: K", slow, slow),
			twoCreds("api_key_env: K", "api_key_env: K", "", ""),
			twoCreds("api_key_env: K", "api_key_env: OTHER", slow, fast),
		} {
			_, err := config.Parse(doc, vars)
			require.NoError(t, err, "%s", doc)
		}
	})
}

// parseWithoutSecrets is Parse through LoadWithoutSecrets, from a file in t's temp dir.
func parseWithoutSecrets(t *testing.T) func([]byte, func(string) string) (*config.Config, error) {
	return func(doc []byte, getenv func(string) string) (*config.Config, error) {
		path := filepath.Join(t.TempDir(), "llmq.yaml")
		require.NoError(t, os.WriteFile(path, doc, 0o600))
		return config.LoadWithoutSecrets(path, getenv)
	}
}

func TestParse_EnvOverrideNamesTheVariable(t *testing.T) {
	t.Parallel()

	// The file is right; the variable is not: the error says which.
	_, err := config.Parse(minimal(goodCred, ""), env(map[string]string{
		config.EnvDatabaseURL: "postgres//typo", config.EnvRedisURL: "127.0.0.1:6379", "ANTHROPIC_API_KEY": secret,
	}))
	require.ErrorContains(t, err, "database_url (from LLMQ_DATABASE_URL): must be a postgres:// URL")
	require.ErrorContains(t, err, "redis_url (from LLMQ_REDIS_URL): must be")
}

func TestParse_APIKeyEnvWhiteSpace(t *testing.T) {
	t.Parallel()

	// An env file saved with CRLF: the key is read as a file's key is, trimmed.
	cfg, err := config.Parse(minimal(goodCred, ""), env(map[string]string{"ANTHROPIC_API_KEY": secret + "\r"}))
	require.NoError(t, err)
	require.Equal(t, secret, cfg.Credentials[0].APIKey())

	for name, v := range map[string]string{"Blank": "  ", "Inner": "sk-a b", "Control": "sk-a\x01b"} {
		_, err := config.Parse(minimal(goodCred, ""), env(map[string]string{"ANTHROPIC_API_KEY": v}))
		require.ErrorContains(t, err, "credentials[0].api_key_env", name)
	}
}

func TestParse_ListenAddresses(t *testing.T) {
	t.Parallel()

	for field, doc := range map[string][]byte{
		"api.listen":            minimal(goodCred, "api: { listen: '8080' }\n"),
		"worker.metrics_listen": minimal(goodCred, "worker: { metrics_listen: 'http://127.0.0.1:9091' }\n"),
	} {
		t.Run(field, func(t *testing.T) {
			_, err := config.Parse(doc, secretEnv)
			require.ErrorContains(t, err, field+": must be host:port")
		})
	}
	cfg, err := config.Parse(minimal(goodCred, "api: { listen: ':8080' }\nworker: { metrics_listen: 'off' }\n"), secretEnv)
	require.NoError(t, err)
	require.Equal(t, ":8080", cfg.API.Listen)
}

func TestParse_DurationsOutOfBounds(t *testing.T) {
	t.Parallel()

	for field, doc := range map[string][]byte{
		// 10 × 200000h, the poll's longest backoff, overflows time.Duration.
		"credentials[0].batch.poll_interval":    minimal(goodCred+"\nbatch: { enabled: true, poll_interval: 200000h }", ""),
		"credentials[0].batch.max_wait_to_fill": minimal(goodCred+"\nbatch: { enabled: true, window: 1h, max_wait_to_fill: 2h }", ""),
		// Plus the breaker's 30s, an attempt timeout near time.Duration's limit overflows.
		"credentials[0].attempt_timeout":    minimal(goodCred+"\nattempt_timeout: 2562047h47m", ""),
		"credentials[0].first_byte_timeout": minimal(goodCred+"\nfirst_byte_timeout: 1ns", ""),
		"credentials[0].stall_timeout":      minimal(goodCred+"\nstall_timeout: 1ns", ""),
		"breaker.cooldown":                  minimal(goodCred, "breaker: { cooldown: 1ns }\n"),
		"api.stream_url_ttl":                minimal(goodCred, "api: { stream_url_ttl: 8760h }\n"),
		"api.drain_delay":                   minimal(goodCred, "api: { drain_delay: 31s }\n"),
	} {
		t.Run(field, func(t *testing.T) {
			_, err := config.Parse(doc, secretEnv)
			require.ErrorContains(t, err, field+": must be")
		})
	}
	_, err := config.Parse(minimal(goodCred+"\nattempt_timeout: 24h\nfirst_byte_timeout: 1ms\nstall_timeout: 24h\nbatch: { window: 1h, max_wait_to_fill: 1h, poll_interval: 1h }",
		"breaker: { cooldown: 1ms }\napi: { stream_url_ttl: 1s, drain_delay: 30s }\n"), secretEnv)
	require.NoError(t, err)
}

// stall_timeout is bounded as first_byte_timeout is, in the same words: 0 is off, else 1ms to 24h.
func TestParse_StallTimeoutBounds(t *testing.T) {
	t.Parallel()

	for value, want := range map[string]string{
		"-1s": "credentials[0].stall_timeout: must be between 1ms and 24h0m0s, or 0 (none), got -1s",
		"25h": "credentials[0].stall_timeout: must be between 1ms and 24h0m0s, or 0 (none), got 25h0m0s",
		"0s":  "",
		"1ms": "",
		"30s": "",
	} {
		t.Run(value, func(t *testing.T) {
			t.Parallel()
			cfg, err := config.Parse(minimal(goodCred+"\nstall_timeout: "+value, ""), secretEnv)
			if want != "" {
				require.ErrorContains(t, err, want)
				return
			}
			require.NoError(t, err)
			d, err := time.ParseDuration(value)
			require.NoError(t, err)
			require.Equal(t, d, cfg.Credentials[0].StallTimeout)
		})
	}
}

// A value of the wrong kind (a duration without its unit, a word for a number) is named by its
// field, as a value out of bounds is, not only by its line: the line of a one-line block
// (`retry: { base_delay: 30, max_delay: 60s }`) holds several fields.
func TestParse_WrongKindNamesTheField(t *testing.T) {
	t.Parallel()

	for field, doc := range map[string][]byte{
		"retry.base_delay":                   minimal(goodCred, "retry: { max_delay: 60s, base_delay: 30 }\n"),
		"worker.phase_margin":                minimal(goodCred, "worker:\n  phase_margin: 0\n"),
		"worker.concurrency":                 minimal(goodCred, "worker: { concurrency: many }\n"),
		"credentials[0].first_byte_timeout":  minimal(goodCred+"\nfirst_byte_timeout: 5", ""),
		"credentials[0].stall_timeout":       minimal(goodCred+"\nstall_timeout: 5", ""),
		"credentials[0].batch.poll_interval": minimal(goodCred+"\nbatch: { enabled: true, poll_interval: 30 }", ""),
		"fairness.min_share.low":             minimal(goodCred, "fairness: { min_share: { low: [1] } }\n"),
		"retry.max_delay":                    minimal(goodCred, "retry: { base_delay: 1s, max_delay: 123456789012 }\n"), // yaml shortens it
		"worker.concurency":                  minimal(goodCred, "worker: { queue: q, concurency: 5 }\n"),                // an unknown key
	} {
		t.Run(field, func(t *testing.T) {
			t.Parallel()
			_, err := config.Parse(doc, secretEnv)
			require.ErrorContains(t, err, field+": ")
			require.ErrorContains(t, err, "line ", "the line is kept")
		})
	}
}

// A value reached through an alias (`*n`, or a merge key `<<: *w`) is reported by yaml at the
// line of its anchor, where the field is another one, of the right kind: the message keeps its
// line and names no field rather than the wrong one.
func TestParse_WrongKindThroughAnAliasNamesNoField(t *testing.T) {
	t.Parallel()

	for name, extra := range map[string]string{
		"alias": "worker: { concurrency: &n 5 }\nretry: { base_delay: *n }\n",
		"merge": "worker: &w { concurrency: 5 }\nretry:\n  <<: *w\n",
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			_, err := config.Parse(minimal(goodCred, extra), secretEnv)
			require.ErrorContains(t, err, "line 6: ")
			require.NotContains(t, err.Error(), "worker.concurrency")
		})
	}
}

// A value of the wrong kind, or an unknown key, is told in the file's terms: what to write there
// and, for a misspelt key, the key meant; never the Go type it was to be decoded into
// (config.Retry, []config.Credential, time.Duration) or yaml's tags (!!str, !!map).
func TestParse_WrongKindSaysWhatToWrite(t *testing.T) {
	t.Parallel()

	for name, tc := range map[string]struct {
		doc  []byte
		want string
	}{
		"MisspeltKey": {minimal(goodCred, "retry: { max_atempts: 5 }\n"), "retry.max_atempts: line 6: unknown key max_atempts (did you mean max_attempts?)"},
		"KeyInCase":   {minimal(goodCred, "worker: { Concurrency: 5 }\n"), "worker.Concurrency: line 6: unknown key Concurrency (did you mean concurrency?)"},
		"TopLevelKey": {minimal(goodCred, "redis: redis://127.0.0.1:6379/0\n"), "redis: line 6: unknown key redis (did you mean redis_url?)"},
		"CredKey":     {minimal(goodCred+"\napi_key: K", ""), "credentials[0].api_key: line 6: unknown key api_key (did you mean api_key_env?)"},
		"FarKey":      {minimal(goodCred, "retry: { jitter: full }\n"), "retry.jitter: line 6: unknown key jitter"},
		"WordForInt":  {minimal(goodCred, "worker: { concurrency: lots }\n"), "worker.concurrency: line 6: want a whole number (got \"lots\")"},
		"Duration":    {minimal(goodCred, "retry: { base_delay: 30 }\n"), "retry.base_delay: line 6: want a duration with its unit, such as 30s or 500ms (got \"30\")"},
		"Bool":        {minimal(goodCred, "api: { allow_anonymous: yes please }\n"), "api.allow_anonymous: line 6: want true or false (got \"yes please\")"},
		"Float":       {minimal(goodCred+"\nlimits: { requests_per_second: fast, burst: 5 }", ""), "credentials[0].limits.requests_per_second: line 6: want a number (got \"fast\")"},
		"ListForMap":  {minimal(goodCred, "worker: [1, 2]\n"), "worker: line 6: want a block of keys (got a list)"},
		"MapForList":  {[]byte("credentials:\n  name: a\n  provider: openai\n"), "credentials: line 2: want a list (got a block of keys)"},
		"ListForWord": {minimal(goodCred, "redis_url: [a]\n"), "redis_url: line 6: want a string (got a list)"},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			_, err := config.Parse(tc.doc, secretEnv)
			require.ErrorContains(t, err, tc.want)
			require.NotContains(t, err.Error(), "config.")
			require.NotContains(t, err.Error(), "!!")
		})
	}
}

// A fraction where a whole number goes is refused naming the field: yaml.v3 truncates it
// (`concurrency: 2.5` ran 2 deliveries, and `0.5` became 0, which took the default, 200). A
// whole number written as a float (`10.0`, `4.194304e6`) is that number.
func TestParse_FractionForAWholeNumberIsRefused(t *testing.T) {
	t.Parallel()

	for field, doc := range map[string][]byte{
		"worker.concurrency":                          minimal(goodCred, "worker: { concurrency: 2.5 }\n"),
		"retry.max_attempts":                          minimal(goodCred, "retry:\n  max_attempts: 0.5\n"),
		"credentials[0].limits.burst":                 minimal(goodCred+"\nlimits: { requests_per_second: 5, burst: 1.5 }", ""),
		"api.max_body_bytes":                          minimal(goodCred, "api: { max_body_bytes: 1e-3 }\n"),
		"api.tenant_submit_rate.burst":                minimal(goodCred, "api: { tenant_submit_rate: { requests_per_second: 1, burst: .inf } }\n"),
		"credentials[0].batch.max_requests_per_batch": minimal(goodCred+"\nbatch: { enabled: true, max_requests_per_batch: 99.9 }", ""),
	} {
		t.Run(field, func(t *testing.T) {
			t.Parallel()
			_, err := config.Parse(doc, secretEnv)
			require.ErrorContains(t, err, field+": line ")
			require.ErrorContains(t, err, "want a whole number")
		})
	}

	cfg, err := config.Parse(minimal(goodCred, "worker: { concurrency: 10.0 }\napi: { max_body_bytes: 4.194304e6 }\n"), secretEnv)
	require.NoError(t, err)
	require.Equal(t, 10, cfg.Worker.Concurrency)
	require.Equal(t, int64(4194304), cfg.API.MaxBodyBytes)
}
