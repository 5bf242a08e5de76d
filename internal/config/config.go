// Package config loads llmq's one YAML file, shared by the api, worker and ctl programs.
//
// The file format is a contract (README.md, Configuration). Unknown fields are rejected so that a
// typo does not silently fall back to a default, and so is a second YAML document; every validation
// error names the field (or the variable that overrode it). Secrets are only referenced
// (api_key_env, api_key_file) and resolved at load time; they never appear in errors.
package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"gopkg.in/yaml.v3"
)

// Env variables that override the file.
const (
	EnvConfig      = "LLMQ_CONFIG"
	EnvDatabaseURL = "LLMQ_DATABASE_URL"
	EnvRedisURL    = "LLMQ_REDIS_URL"
)

// Config is the whole file. Zero fields take the defaults documented on each field.
type Config struct {
	// DatabaseURL is the Postgres URL. Default
	// postgres://postgres@127.0.0.1:5432/llmq?sslmode=disable.
	DatabaseURL string `yaml:"database_url"`
	// RedisURL is the Redis URL: redis://, rediss://, redis-socket://, redis-sentinel:// or
	// redis-cluster://host1:port,host2:port. Default redis://127.0.0.1:6379/0.
	RedisURL string `yaml:"redis_url"`
	// API configures cmd/api.
	API API `yaml:"api"`
	// Worker configures cmd/worker.
	Worker Worker `yaml:"worker"`
	// Credentials are the provider keys jobs may use. At least one is required.
	Credentials []Credential `yaml:"credentials"`
	// Retry is the default retry policy.
	Retry Retry `yaml:"retry"`
	// Alerts configures where dead-letter alerts go besides logs and metrics.
	Alerts Alerts `yaml:"alerts"`
	// Breaker configures the per-credential circuit breaker shared by all workers.
	Breaker Breaker `yaml:"breaker"`
	// Retention says how long finished jobs are kept (see Retention).
	Retention Retention `yaml:"retention"`
	// Fairness says how tenants and priorities share a credential (see Fairness).
	Fairness Fairness `yaml:"fairness"`
	// Streaming configures streaming jobs' delta buffers (see Streaming).
	Streaming Streaming `yaml:"streaming"`
}

// Breaker configures the circuit breaker.
type Breaker struct {
	// Threshold is how many consecutive server-side failures (5xx, 529, timeouts, connection
	// errors) open a credential's breaker. 0: the breaker's default, 5.
	Threshold int `yaml:"threshold"`
	// Cooldown is how long an open breaker refuses calls before one probe is let through; it
	// grows ×1.4 after each failed probe, up to MaxCooldown. 0: the breaker's default, 2s; else
	// at least 1ms.
	Cooldown time.Duration `yaml:"cooldown"`
	// MaxCooldown caps the cooldown: the longest a recovered provider goes unnoticed, and one
	// probe per MaxCooldown during a long outage. 0: the breaker's default, 30s (or Cooldown when
	// that is longer).
	MaxCooldown time.Duration `yaml:"max_cooldown"`
	// ColdStartCap, when on, lets at most threshold requests out on a credential with no success
	// in the last minute until one answers, so an outage that is already under way costs exactly
	// threshold requests to detect, at the price of one provider round trip for a burst on an
	// idle credential. Default on; set false to turn it off.
	ColdStartCap *bool `yaml:"cold_start_cap"`
}

// DefaultBreakerCooldown is the breaker's default cooldown (breaker.DefaultCooldown), against
// which a max_cooldown given alone is checked.
const DefaultBreakerCooldown = 2 * time.Second

// ColdStart reports whether the cold-start cap is on (the default).
func (b Breaker) ColdStart() bool { return b.ColdStartCap == nil || *b.ColdStartCap }

// API configures the HTTP API.
type API struct {
	// Listen is the address to serve on, host:port (the host may be empty). Default 127.0.0.1:8080.
	Listen string `yaml:"listen"`
	// AllowAnonymous maps requests without a bearer token to tenant "default" (development only),
	// as stored when an operator created it (its credentials, its revocation).
	AllowAnonymous bool `yaml:"allow_anonymous"`
	// MaxBodyBytes caps a submitted body; larger bodies get 413. Default 4 MiB.
	MaxBodyBytes int64 `yaml:"max_body_bytes"`
	// MaxBodyBytesInFlight caps the bytes of the submit bodies one API process reads at once
	// (each counted at its Content-Length, or MaxBodyBytes without one); above it a submit gets
	// 503 with Retry-After. One tenant holds at most half of it (at least MaxBodyBytes). Default
	// 64 × MaxBodyBytes; at least MaxBodyBytes.
	MaxBodyBytesInFlight int64 `yaml:"max_body_bytes_in_flight"`
	// TenantSubmitRate, when set, limits each tenant's submits (POST /v1/jobs), shared by every
	// API replica through Redis; above it the API answers 429 with Retry-After. Default: off.
	TenantSubmitRate *SubmitRate `yaml:"tenant_submit_rate"`
	// ReadTimeout bounds reading one request, headers and body: a client that trickles its body
	// is cut off. Also the worker's /metrics server. Default 30s.
	ReadTimeout time.Duration `yaml:"read_timeout"`
	// WriteTimeout bounds writing one answer: a reader that stalls is cut off. Event streams
	// use EventWriteTimeout per event instead. Also the worker's /metrics server. Default 30s.
	WriteTimeout time.Duration `yaml:"write_timeout"`
	// IdleTimeout closes a keep-alive connection that sends no request for that long. Also the
	// worker's /metrics server. Default 60s.
	IdleTimeout time.Duration `yaml:"idle_timeout"`
	// EventWriteTimeout bounds writing each event (and keep-alive) of an event stream, the API's
	// (each 16 KiB of an event: a slow but steady reader gets a large one) and the console's: a
	// client that stops reading is cut off and the stream's memory freed. Default 10s.
	EventWriteTimeout time.Duration `yaml:"event_write_timeout"`
	// StoreTimeout bounds a submit's, a poll's or a cancel's work in Postgres (not a submit
	// body's arrival), and a console action's: a request that Postgres has not answered by then
	// (a statement waiting for a lock, an I/O stall, a failover) is answered 503 unavailable
	// with Retry-After. Less than WriteTimeout, so that the answer is sent. Default 10s, or a
	// third of WriteTimeout when that is less.
	StoreTimeout time.Duration `yaml:"store_timeout"`
	// MaxConnections caps the API's open connections; a connection above it is answered 503
	// with Retry-After and closed. Default 0: three quarters of the process's open-file limit,
	// at most 10,000.
	MaxConnections int `yaml:"max_connections"`
	// MaxStreamsPerTenant caps each tenant's open event streams on one API replica; above it
	// GET /v1/jobs/{id}/events answers 429 with Retry-After. Default 100.
	MaxStreamsPerTenant int `yaml:"max_streams_per_tenant"`
	// MaxKeyedSubmitsPerTenant caps each tenant's submits with an Idempotency-Key and cancels,
	// together, in progress against Postgres on one API replica (each holds a Postgres
	// connection of its own for its transaction): one above it waits up to 5 s for one of them
	// to end, then is answered 429 too_many_submits (too_many_cancels for a cancel) with
	// Retry-After. Default 0: half the process's Postgres pool (pool_max_conns, 16 by default:
	// 8), at least 1.
	MaxKeyedSubmitsPerTenant int `yaml:"max_keyed_submits_per_tenant"`
	// MaxStreams caps the event streams open on one API replica, every tenant's together; above
	// it GET /v1/jobs/{id}/events answers 503 overloaded with Retry-After, having read nothing.
	// Default 0: half of MaxConnections (as derived when 0), so that a replica full of streams
	// keeps as many connections for submits, polls and health checks.
	MaxStreams int `yaml:"max_streams"`
	// StreamSecretEnv or StreamSecretFile (not both) names where the key that signs event-stream
	// URLs lives: an environment variable, or a file (trailing white space trimmed). It must be
	// at least 32 bytes and the same on every API replica. With it, each job the API answers
	// with carries events_url: a short-lived URL that follows that job alone, which a browser can
	// open without a bearer token. Default: none (no events_url).
	StreamSecretEnv  string `yaml:"stream_secret_env"`
	StreamSecretFile string `yaml:"stream_secret_file"`
	// StreamURLTTL is how long an events_url is accepted after it was issued (a stream opened
	// in time runs to its end). Default 10m; between 1s and 24h.
	StreamURLTTL time.Duration `yaml:"stream_url_ttl"`
	// DrainDelay is how long a stopping API (or serve) process goes on serving, /readyz
	// answering 503, before it stops listening: the time its load balancer takes to see the 503
	// and stop sending it requests, which would otherwise be refused. Default 0 (it stops
	// listening at the signal); at most 30s.
	DrainDelay time.Duration `yaml:"drain_delay"`

	// streamSecret is behind a pointer, as Credential's apiKey, so that printing a Config or an
	// API (%v, %+v, %#v, slog) shows an address, not the key that signs every events_url.
	streamSecret    *string
	streamSecretErr error
}

// MinStreamSecretBytes is the shortest key api.stream_secret_* accepts (HMAC-SHA256's block is
// 64 bytes; 32 random bytes are as strong as its output).
const MinStreamSecretBytes = 32

// StreamSecret returns the key that signs event-stream URLs: nil when none is configured, or
// the error reading it met (an unset variable, an unreadable file, a key too short). It is read
// at load time, but only the API uses it, so only the API fails on that error.
func (a *API) StreamSecret() ([]byte, error) {
	if a.streamSecret == nil {
		return nil, a.streamSecretErr
	}
	return []byte(*a.streamSecret), a.streamSecretErr
}

func (a *API) resolveStreamSecret(getenv func(string) string) {
	var key string
	switch {
	case a.StreamSecretEnv != "":
		key = getenv(a.StreamSecretEnv)
		if key == "" {
			a.streamSecretErr = fmt.Errorf("api.stream_secret_env: environment variable %s is not set", a.StreamSecretEnv)
			return
		}
	case a.StreamSecretFile != "":
		b, err := os.ReadFile(a.StreamSecretFile)
		if err != nil {
			a.streamSecretErr = fmt.Errorf("api.stream_secret_file: cannot read %q: %w", a.StreamSecretFile, errors.Unwrap(err))
			return
		}
		key = strings.TrimSpace(string(b))
	default:
		return
	}
	if len(key) < MinStreamSecretBytes {
		a.streamSecretErr = fmt.Errorf("api.stream_secret_*: the key is %d bytes, want at least %d", len(key), MinStreamSecretBytes)
		return
	}
	a.streamSecret = &key
}

// SubmitRate is a request rate: Burst requests at once, then RequestsPerSecond.
type SubmitRate struct {
	RequestsPerSecond float64 `yaml:"requests_per_second"`
	Burst             int     `yaml:"burst"`
}

// DefaultMetricsListen is worker.metrics_listen's default.
const DefaultMetricsListen = "127.0.0.1:9091"

// Worker configures the job executor.
type Worker struct {
	// Concurrency is the number of jobs one worker process runs at once (llmq serve: the jobs
	// asynq delivers, and as many first deliveries of its own submits). Default 200.
	Concurrency int `yaml:"concurrency"`
	// MetricsListen is where the worker serves /metrics, host:port. Default 127.0.0.1:9091; "off"
	// disables it.
	// llmq serve does not use it: its worker's metrics are on the API's /metrics.
	MetricsListen string `yaml:"metrics_listen"`
	// Queue names the asynq queues: high and normal jobs use it as is, low jobs "<queue>:low"
	// (their deliveries deferred to a later time, a limiter's turn or a retry, come back on
	// "<queue>"). Default "llmq".
	Queue string `yaml:"queue"`
	// SweepInterval is how often the leader re-enqueues jobs whose task Redis lost, and how often
	// the other workers try to lead. Default 10s; between 100ms and 5m.
	SweepInterval time.Duration `yaml:"sweep_interval"`
	// PollInterval is how often an idle worker looks for a queued job it was not woken for.
	// Workers are woken for every task enqueued due now and for tasks whose deferral or retry
	// time came; the poll finds the rest (a wake-up Redis lost, a task enqueued by a process of
	// an earlier version during an upgrade). An idle worker's Redis polling grows as it shrinks.
	// Default 100ms; at least 1ms; an idle worker waits at most 2s whatever it is.
	PollInterval time.Duration `yaml:"poll_interval"`
	// TokenMinute is the length of the providers' token-limit "minute". Default 1m; only a
	// simulator with a scaled-down minute (benchmarks) differs.
	TokenMinute time.Duration `yaml:"token_minute"`
	// PhaseMargin is how much later than its slot a request that waits for a provider's refill
	// is sent: room for the provider's clock and for the lateness of the requests before it (a
	// burst sent late makes the provider's refill start late). Default 100ms, which 0 also
	// takes; 1ns is as good as none; at most 5s. A
	// loaded deployment whose requests leave well after their grants may need more; so do tests
	// with a scaled-down token_minute, where a few hundred ms of lateness is a large share of a
	// refill.
	PhaseMargin time.Duration `yaml:"phase_margin"`
	// MaxAnswerBytes bounds the bytes of provider answers one worker process holds at once (each
	// answer is capped at 32 MiB): a call waits for room, none is dropped. Default 256 MiB; at
	// least 32 MiB, so that the largest answer fits.
	MaxAnswerBytes int64 `yaml:"max_answer_bytes"`
	// BacklogSteps bounds how many deliveries of low-priority jobs run their steps before the
	// call at once in one worker process (loading the job, asking for its turn, deferring it
	// when refused); the others wait for a place. A backlog's pass over thousands of low jobs
	// then leaves the process's Postgres connections and CPU to other priorities' jobs. The
	// call itself, and a wait for a slot, are outside the bound. Default 8.
	BacklogSteps int `yaml:"backlog_steps"`
}

// Credential is one provider API key and where it lives.
type Credential struct {
	// Name is how jobs refer to it ("credential" in the submit body).
	Name string `yaml:"name"`
	// Provider is anthropic or openai; it decides the wire format.
	Provider string `yaml:"provider"`
	// BaseURL is the provider's root (https://api.anthropic.com, https://api.openai.com): an
	// absolute http(s) URL without user information, query or fragment; a trailing /v1 is not
	// doubled.
	BaseURL string `yaml:"base_url"`
	// APIKeyEnv names the environment variable holding the key (surrounding white space trimmed;
	// white space or a control character inside is refused).
	APIKeyEnv string `yaml:"api_key_env"`
	// APIKeyFile names a file holding the key (trailing white space trimmed).
	APIKeyFile string `yaml:"api_key_file"`
	// Limits, when set, are the provider's request limit; when absent they are learned. Credentials
	// with one provider, base URL and key share one limit: their Limits must be equal.
	Limits *Limits `yaml:"limits"`
	// AttemptTimeout bounds one provider call. Default 5m; between 1ms and 24h (a job's longest
	// timeout).
	AttemptTimeout time.Duration `yaml:"attempt_timeout"`
	// FirstByteTimeout, when set, bounds the wait for the first byte of an answer's body (a
	// generation that has not started); a timed-out attempt is retried from its own budget.
	// Default 0: only attempt_timeout applies; else between 1ms and 24h. A job may override it.
	FirstByteTimeout time.Duration `yaml:"first_byte_timeout"`
	// StallTimeout, when set, bounds the wait for each next byte of an answer whose body has
	// begun (streamed or not): an answer that stalled partway gives up then, not at
	// attempt_timeout, and is retried from the timeout budget as a first-byte timeout is.
	// Default 0: off (no timer); else between 1ms and 24h. No job overrides it.
	StallTimeout time.Duration `yaml:"stall_timeout"`
	// PauseProbeInterval, when set, lets one job per interval probe a credential paused by a
	// spend cap; its success resumes the credential. Default 0: only an operator resumes it; else
	// at least 100ms.
	PauseProbeInterval time.Duration `yaml:"pause_probe_interval"`
	// Batch configures the credential's batch lane (see Batch). Default: off.
	Batch Batch `yaml:"batch"`

	// apiKey is behind a pointer so that printing a Config or Credential (%v, %+v, %#v, slog)
	// shows an address, not the key: fmt prints unexported fields but only addresses of nested
	// pointers.
	apiKey *string
}

// LimiterID identifies the provider key for the shared limiter: provider, base URL and key, so
// that credentials sharing one key share its limit. The limiter only stores its hash.
func (c Credential) LimiterID() string {
	return c.Provider + "\x00" + c.BaseURL + "\x00" + c.APIKey()
}

// APIKey returns the resolved secret ("" before Load or Parse resolved it). It is never logged
// or stored, and printing the Credential does not show it.
func (c Credential) APIKey() string {
	if c.apiKey == nil {
		return ""
	}
	return *c.apiKey
}

// Limits is a provider rate limit.
type Limits struct {
	RequestsPerSecond float64 `yaml:"requests_per_second"`
	Burst             int     `yaml:"burst"`
	// InputTokensPerMinute and OutputTokensPerMinute are Anthropic-style token buckets;
	// TokensPerMinute is OpenAI's one bucket for input and output together. 0: learned from the
	// provider's token headers (or none).
	InputTokensPerMinute  float64 `yaml:"input_tokens_per_minute"`
	OutputTokensPerMinute float64 `yaml:"output_tokens_per_minute"`
	TokensPerMinute       float64 `yaml:"tokens_per_minute"`
}

// Retry is the retry policy.
type Retry struct {
	// MaxAttempts is the default number of provider calls per job. Default 10.
	MaxAttempts int `yaml:"max_attempts"`
	// BaseDelay is the first full-jitter ceiling. Default 500ms.
	BaseDelay time.Duration `yaml:"base_delay"`
	// MaxDelay caps any computed backoff. Default 60s.
	MaxDelay time.Duration `yaml:"max_delay"`
	// MaxRetryAfter caps what a provider's Retry-After can impose: how far one 429 pushes a
	// credential's shared schedule back (every tenant and worker waits for it) and how long the
	// job waits for its retry. A job whose deadline comes first fails then. Default 5m; between 1s
	// and 1h.
	MaxRetryAfter time.Duration `yaml:"max_retry_after"`
}

// Alerts configures dead-letter alerts.
type Alerts struct {
	// WebhookURL receives a JSON POST per alert when set.
	WebhookURL string `yaml:"webhook_url"`
}

// Defaults.
const (
	DefaultDatabaseURL = "postgres://postgres@127.0.0.1:5432/llmq?sslmode=disable"
	DefaultRedisURL    = "redis://127.0.0.1:6379/0"
	// DefaultMaxAnswerBytes is worker.max_answer_bytes: an eighth of a 2 GiB machine, eight of the
	// largest answers, thousands of ordinary ones.
	DefaultMaxAnswerBytes = 256 << 20
	// DefaultPhaseMargin is worker.phase_margin (limiter.DefaultPhaseMargin, which this package
	// does not import).
	DefaultPhaseMargin = 100 * time.Millisecond
	// DefaultBacklogSteps is worker.backlog_steps: half of a worker's 16 Postgres connections.
	DefaultBacklogSteps = 8
)

// minInterval is the shortest period of a loop that goes to Postgres or a provider each time
// (the sweep, the retention pass, a paused credential's probe): short enough for tests, long
// enough that a unit left off or a typo ("1ns") does not make the loop spin.
const minInterval = 100 * time.Millisecond

// maxJobTimeout is the longest timeout a job may have (the API's default MaxTimeout).
const maxJobTimeout = 24 * time.Hour

// maxAnswer is the largest answer a worker reads (llm.DefaultMaxResponseBytes, which this package
// does not import): worker.max_answer_bytes must hold it.
const maxAnswer = 32 << 20

// Load reads, defaults and validates the file at path, applies env overrides and resolves
// secrets. A missing file is an error naming the path tried. getenv looks up environment
// variables; nil means os.Getenv.
func Load(path string, getenv func(string) string) (*Config, error) {
	return load(path, getenv, true)
}

// LoadWithoutSecrets is Load for programs that never call a provider (the API, most ctl
// commands): credentials are validated but their keys are not read, so those programs need no
// access to the secrets. Credential.APIKey returns "" on its result.
func LoadWithoutSecrets(path string, getenv func(string) string) (*Config, error) {
	return load(path, getenv, false)
}

func load(path string, getenv func(string) string, secrets bool) (*Config, error) {
	if path == "" {
		return nil, fmt.Errorf("no config file given: pass --config or set %s", EnvConfig)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("config file %q not found", path)
		}
		return nil, fmt.Errorf("read config %q: %w", path, err)
	}
	cfg, err := parse(data, getenv, secrets)
	if err != nil {
		return nil, fmt.Errorf("config %q: %w", path, err)
	}
	return cfg, nil
}

// Parse decodes YAML, applies env overrides and defaults, validates and resolves secrets.
// getenv looks up environment variables; nil means os.Getenv.
func Parse(data []byte, getenv func(string) string) (*Config, error) {
	return parse(data, getenv, true)
}

func parse(data []byte, getenv func(string) string, secrets bool) (*Config, error) {
	if getenv == nil {
		getenv = os.Getenv
	}
	var cfg Config
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&cfg); err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("parse yaml: %w", nameFields(data, err))
	}
	// A second document ("---" then more settings, say two files pasted together) would be
	// ignored by Decode: refuse it rather than run on half the file.
	var rest yaml.Node
	if err := dec.Decode(&rest); err == nil && !emptyDocument(&rest) {
		return nil, fmt.Errorf("parse yaml: line %d: a second YAML document; the file must hold one", rest.Line)
	} else if err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("parse yaml: %w", err)
	}
	if err := wholeNumbers(data); err != nil {
		return nil, fmt.Errorf("parse yaml: %w", err)
	}
	cfg.Retention.markEmpty(data)
	// An override is named as the variable it came from: the file's own value is not at fault.
	dbField, redisField := "database_url", "redis_url"
	if v := getenv(EnvDatabaseURL); v != "" {
		cfg.DatabaseURL, dbField = v, "database_url (from "+EnvDatabaseURL+")"
	}
	if v := getenv(EnvRedisURL); v != "" {
		cfg.RedisURL, redisField = v, "redis_url (from "+EnvRedisURL+")"
	}
	cfg.withDefaults()
	if err := cfg.validate(dbField, redisField); err != nil {
		return nil, err
	}
	cfg.API.resolveStreamSecret(getenv) // its error is the API's alone: see API.StreamSecret
	if !secrets {
		return &cfg, nil
	}
	if err := cfg.resolveSecrets(getenv); err != nil {
		return nil, err
	}
	return &cfg, nil
}

// emptyDocument reports whether n, a decoded document, holds nothing (a trailing "---", or
// only comments).
func emptyDocument(n *yaml.Node) bool {
	if n.Kind == yaml.DocumentNode && len(n.Content) == 1 {
		n = n.Content[0]
	}
	return n.Kind == 0 || (n.Kind == yaml.ScalarNode && n.Tag == "!!null")
}

func (c *Config) withDefaults() {
	c.DatabaseURL = or(c.DatabaseURL, DefaultDatabaseURL)
	c.RedisURL = or(c.RedisURL, DefaultRedisURL)
	c.API.Listen = or(c.API.Listen, "127.0.0.1:8080")
	if c.API.MaxBodyBytes == 0 {
		c.API.MaxBodyBytes = 4 << 20
	}
	if c.API.MaxBodyBytesInFlight == 0 {
		c.API.MaxBodyBytesInFlight = 64 * c.API.MaxBodyBytes
	}
	c.API.ReadTimeout = orDuration(c.API.ReadTimeout, 30*time.Second)
	c.API.WriteTimeout = orDuration(c.API.WriteTimeout, 30*time.Second)
	c.API.IdleTimeout = orDuration(c.API.IdleTimeout, 60*time.Second)
	c.API.EventWriteTimeout = orDuration(c.API.EventWriteTimeout, 10*time.Second)
	c.API.StoreTimeout = orDuration(c.API.StoreTimeout, min(10*time.Second, c.API.WriteTimeout/3))
	if c.API.MaxStreamsPerTenant == 0 {
		c.API.MaxStreamsPerTenant = 100
	}
	if c.API.StreamURLTTL == 0 {
		c.API.StreamURLTTL = 10 * time.Minute
	}
	if c.Worker.Concurrency == 0 {
		c.Worker.Concurrency = 200
	}
	c.Worker.MetricsListen = or(c.Worker.MetricsListen, DefaultMetricsListen)
	c.Worker.Queue = or(c.Worker.Queue, "llmq")
	if c.Worker.SweepInterval == 0 {
		c.Worker.SweepInterval = 10 * time.Second
	}
	if c.Worker.PollInterval == 0 {
		c.Worker.PollInterval = 100 * time.Millisecond
	}
	if c.Worker.PhaseMargin == 0 {
		c.Worker.PhaseMargin = DefaultPhaseMargin
	}
	if c.Worker.MaxAnswerBytes == 0 {
		c.Worker.MaxAnswerBytes = DefaultMaxAnswerBytes
	}
	if c.Worker.BacklogSteps == 0 {
		c.Worker.BacklogSteps = DefaultBacklogSteps
	}
	if c.Retry.MaxAttempts == 0 {
		c.Retry.MaxAttempts = 10
	}
	if c.Retry.BaseDelay == 0 {
		c.Retry.BaseDelay = 500 * time.Millisecond
	}
	if c.Retry.MaxDelay == 0 {
		c.Retry.MaxDelay = 60 * time.Second
	}
	c.Retention.withDefaults()
	c.Fairness.withDefaults()
	c.Streaming.withDefaults()
	if c.Retry.MaxRetryAfter == 0 {
		c.Retry.MaxRetryAfter = 5 * time.Minute
	}
	for i := range c.Credentials {
		if c.Credentials[i].AttemptTimeout == 0 {
			c.Credentials[i].AttemptTimeout = 5 * time.Minute
		}
		c.Credentials[i].Batch.withDefaults()
	}
}

var (
	nameRE   = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$`)
	envVarRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
)

// redisSchemes are the URL schemes dispatch.RedisConnOpt understands.
var redisSchemes = map[string]bool{
	"redis": true, "rediss": true, "redis-socket": true, "redis-sentinel": true, "redis-cluster": true,
}

// validate checks every field, and reports every bad one by name; dbField and redisField name
// where the store URLs came from (the file's field, or the variable that overrode it).
func (c *Config) validate(dbField, redisField string) error {
	var errs []error
	bad := func(field, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s: %s", field, fmt.Sprintf(format, args...)))
	}
	if u, err := url.Parse(c.DatabaseURL); err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
		bad(dbField, "must be a postgres:// URL")
	}
	if u, err := url.Parse(c.RedisURL); err != nil || !redisSchemes[u.Scheme] {
		bad(redisField, "must be a redis://, rediss://, redis-socket://, redis-sentinel:// or redis-cluster:// URL")
	}
	c.API.validate(bad)
	c.Worker.validate(bad)
	c.Retry.validate(bad)
	c.Breaker.validate(bad)
	if c.Alerts.WebhookURL != "" {
		if u, err := url.Parse(c.Alerts.WebhookURL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			bad("alerts.webhook_url", "must be an absolute http(s) URL")
		}
	}
	c.Retention.validate(bad)
	c.Fairness.validate(bad)
	c.Streaming.validate(bad)
	if len(c.Credentials) == 0 {
		bad("credentials", "at least one credential is required")
	}
	seen := map[string]bool{}
	for i := range c.Credentials {
		c.Credentials[i].validate(fmt.Sprintf("credentials[%d]", i), seen, bad)
	}
	// Without the keys (LoadWithoutSecrets), the same variable or file is the same key.
	c.checkSharedLimits(func(cr Credential) string {
		return cr.Provider + "\x00" + cr.BaseURL + "\x00" + cr.APIKeyEnv + "\x00" + filepath.Clean(cr.APIKeyFile)
	}, bad)
	return errors.Join(errs...)
}

// checkSharedLimits reports a credential whose limits differ from those of an earlier one with
// the same key (id): the limiter keeps one bucket per key, which would follow whichever limit
// the last request carried.
func (c *Config) checkSharedLimits(id func(Credential) string, bad func(field, format string, args ...any)) {
	first := map[string]int{}
	for i, cr := range c.Credentials {
		j, ok := first[id(cr)]
		if !ok {
			first[id(cr)] = i
			continue
		}
		if !sameLimits(c.Credentials[j].Limits, cr.Limits) {
			bad(fmt.Sprintf("credentials[%d].limits", i), "%q uses the same key as %q (credentials[%d]) with other limits; a key has one limit: give both the same limits",
				cr.Name, c.Credentials[j].Name, j)
		}
	}
}

func sameLimits(a, b *Limits) bool {
	if a == nil || b == nil {
		return a == b
	}
	return *a == *b
}

// checkListen reports a listen address that is not host:port (a bare port, a URL), which would
// otherwise fail only once the process has opened its stores, without the field's name.
func checkListen(field, addr string, bad func(field, format string, args ...any)) {
	if _, port, err := net.SplitHostPort(addr); err != nil || port == "" {
		bad(field, "must be host:port, such as 127.0.0.1:8080 or :8080 (got %q)", addr)
	}
}

func (a *API) validate(bad func(field, format string, args ...any)) {
	checkListen("api.listen", a.Listen, bad)
	if a.MaxBodyBytes < 0 {
		bad("api.max_body_bytes", "must be positive")
	}
	if a.MaxBodyBytesInFlight < a.MaxBodyBytes {
		bad("api.max_body_bytes_in_flight", "must be at least api.max_body_bytes (%d)", a.MaxBodyBytes)
	}
	for _, f := range []struct {
		name string
		d    time.Duration
	}{{"api.read_timeout", a.ReadTimeout}, {"api.write_timeout", a.WriteTimeout},
		{"api.idle_timeout", a.IdleTimeout}, {"api.event_write_timeout", a.EventWriteTimeout}} {
		if f.d < time.Millisecond {
			bad(f.name, "must be at least 1ms")
		}
	}
	if a.StoreTimeout <= 0 || a.StoreTimeout >= a.WriteTimeout {
		bad("api.store_timeout", "must be more than 0 and less than api.write_timeout (%s), which would cut its 503, got %s", a.WriteTimeout, a.StoreTimeout)
	}
	if a.DrainDelay < 0 || a.DrainDelay > 30*time.Second {
		bad("api.drain_delay", "must be between 0 and 30s, got %s", a.DrainDelay)
	}
	if a.MaxConnections < 0 {
		bad("api.max_connections", "must be positive")
	}
	if a.MaxStreamsPerTenant < 0 {
		bad("api.max_streams_per_tenant", "must be positive")
	}
	if a.MaxKeyedSubmitsPerTenant < 0 {
		bad("api.max_keyed_submits_per_tenant", "must be positive (0: half the Postgres pool)")
	}
	if a.MaxStreams < 0 {
		bad("api.max_streams", "must be positive")
	}
	if r := a.TenantSubmitRate; r != nil && (!(r.RequestsPerSecond > 0) || math.IsInf(r.RequestsPerSecond, 1) || r.Burst <= 0) {
		bad("api.tenant_submit_rate", "requests_per_second and burst must both be positive and finite")
	}
	if a.StreamSecretEnv != "" && a.StreamSecretFile != "" {
		bad("api", "at most one of stream_secret_env and stream_secret_file")
	}
	if a.StreamSecretEnv != "" && !envVarRE.MatchString(a.StreamSecretEnv) {
		bad("api.stream_secret_env", "must name an environment variable (letters, digits, '_'), not hold the key")
	}
	if a.StreamURLTTL < time.Second || a.StreamURLTTL > 24*time.Hour {
		// Shorter, a browser could not open its URL; longer, a leaked URL is not short-lived.
		bad("api.stream_url_ttl", "must be between 1s and 24h, got %s", a.StreamURLTTL)
	}
}

func (w *Worker) validate(bad func(field, format string, args ...any)) {
	if w.MetricsListen != "off" {
		checkListen("worker.metrics_listen", w.MetricsListen, bad)
	}
	if w.Concurrency < 0 {
		bad("worker.concurrency", "must be positive")
	}
	if w.TokenMinute < 0 || (w.TokenMinute != 0 && w.TokenMinute < time.Second) {
		bad("worker.token_minute", "must be at least 1s (the limiter's smallest token minute)")
	}
	if w.SweepInterval < minInterval || w.SweepInterval > 5*time.Minute {
		// Above it, LLMQSweeperStalled (10 minutes without a pass) would fire on a healthy sweeper.
		// Below minInterval, each pass, which reads every unfinished job, and each non-leader's
		// try for the leader lock would follow the last without a pause.
		bad("worker.sweep_interval", "must be between 100ms and 5m, got %s", w.SweepInterval)
	}
	if w.PollInterval < time.Millisecond {
		bad("worker.poll_interval", "must be at least 1ms")
	}
	if w.BacklogSteps < 0 {
		bad("worker.backlog_steps", "must be positive, got %d", w.BacklogSteps)
	}
	if w.PhaseMargin < 0 || w.PhaseMargin > 5*time.Second {
		bad("worker.phase_margin", "must be at most 5s and not negative (0 takes the default, 100ms; 1ns is as good as none), got %s", w.PhaseMargin)
	}
	if w.MaxAnswerBytes < maxAnswer {
		bad("worker.max_answer_bytes", "must be at least %d (32 MiB, the largest answer), got %d", maxAnswer, w.MaxAnswerBytes)
	}
}

func (r *Retry) validate(bad func(field, format string, args ...any)) {
	if r.MaxAttempts < 0 || r.MaxAttempts > 100 {
		bad("retry.max_attempts", "must be between 1 and 100")
	}
	if r.BaseDelay < 0 {
		bad("retry.base_delay", "must be positive")
	}
	if r.MaxDelay < r.BaseDelay {
		bad("retry.max_delay", "must be at least retry.base_delay")
	}
	if r.MaxRetryAfter < time.Second || r.MaxRetryAfter > time.Hour {
		bad("retry.max_retry_after", "must be between 1s and 1h (got %s)", r.MaxRetryAfter)
	}
}

func (b *Breaker) validate(bad func(field, format string, args ...any)) {
	if b.Threshold < 0 {
		bad("breaker.threshold", "must be positive")
	}
	if b.Cooldown < 0 || (b.Cooldown > 0 && b.Cooldown < time.Millisecond) {
		// The breaker refuses less, but only once the worker has opened Redis, and by its own name.
		bad("breaker.cooldown", "must be at least 1ms, got %s", b.Cooldown)
	}
	// Held to the cooldown in force, as the breaker holds it: the one written, else its default.
	cooldown := b.Cooldown
	if cooldown == 0 {
		cooldown = DefaultBreakerCooldown
	}
	if b.MaxCooldown != 0 && b.MaxCooldown < cooldown {
		bad("breaker.max_cooldown", "must be at least breaker.cooldown (%s; default 2s), got %s", cooldown, b.MaxCooldown)
	}
}

// validate checks credential entry f; seen holds the names of the entries before it.
func (cr *Credential) validate(f string, seen map[string]bool, bad func(field, format string, args ...any)) {
	if !nameRE.MatchString(cr.Name) {
		bad(f+".name", "must be 1-64 letters, digits, '_', '.' or '-' (got %q)", cr.Name)
	} else if seen[cr.Name] {
		bad(f+".name", "duplicate credential %q", cr.Name)
	}
	seen[cr.Name] = true
	if cr.Provider != "anthropic" && cr.Provider != "openai" {
		bad(f+".provider", "must be anthropic or openai (got %q)", cr.Provider)
	}
	// Quoted without a password (a proxy's URL may hold one); one that does not parse is not
	// quoted at all.
	if u, err := url.Parse(cr.BaseURL); err != nil {
		bad(f+".base_url", "must be an absolute http(s) URL")
	} else if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		bad(f+".base_url", "must be an absolute http(s) URL (got %q)", u.Redacted())
	} else if u.User != nil {
		bad(f+".base_url", "must not hold credentials: the key goes in api_key_env or api_key_file")
	} else if u.RawQuery != "" || u.ForceQuery || u.Fragment != "" {
		bad(f+".base_url", "must not have a query or fragment: it is the provider's root, such as https://api.anthropic.com (got %q)", u.Redacted())
	}
	if (cr.APIKeyEnv == "") == (cr.APIKeyFile == "") {
		bad(f, "exactly one of api_key_env and api_key_file is required")
	}
	// Not echoed: a value that is not a variable name is likely the key itself pasted here.
	if cr.APIKeyEnv != "" && !envVarRE.MatchString(cr.APIKeyEnv) {
		bad(f+".api_key_env", "must name an environment variable (letters, digits, '_'), not hold the key")
	}
	// YAML's .inf and .nan are numbers too; the limiter refuses them at every reservation.
	finite := func(v float64) bool { return !math.IsNaN(v) && !math.IsInf(v, 0) }
	if l := cr.Limits; l != nil && (!(l.InputTokensPerMinute >= 0) || !(l.OutputTokensPerMinute >= 0) || !(l.TokensPerMinute >= 0) ||
		!finite(l.InputTokensPerMinute) || !finite(l.OutputTokensPerMinute) || !finite(l.TokensPerMinute)) {
		bad(f+".limits", "token limits must be finite and not negative")
	}
	if l := cr.Limits; l != nil && (!(l.RequestsPerSecond > 0) || !finite(l.RequestsPerSecond) || l.Burst <= 0) {
		bad(f+".limits", "requests_per_second and burst must both be positive and finite")
	}
	// At most a day, a job's longest timeout (a longer one is that day; near time.Duration's
	// limit, the breaker's probe timeout, the attempt's plus 30s, would overflow); at least 1ms,
	// as a job's own.
	if cr.AttemptTimeout < time.Millisecond || cr.AttemptTimeout > maxJobTimeout {
		bad(f+".attempt_timeout", "must be between 1ms and %s, got %s", maxJobTimeout, cr.AttemptTimeout)
	}
	if cr.FirstByteTimeout < 0 || (cr.FirstByteTimeout > 0 && cr.FirstByteTimeout < time.Millisecond) || cr.FirstByteTimeout > maxJobTimeout {
		bad(f+".first_byte_timeout", "must be between 1ms and %s, or 0 (none), got %s", maxJobTimeout, cr.FirstByteTimeout)
	}
	if cr.StallTimeout < 0 || (cr.StallTimeout > 0 && cr.StallTimeout < time.Millisecond) || cr.StallTimeout > maxJobTimeout {
		bad(f+".stall_timeout", "must be between 1ms and %s, or 0 (none), got %s", maxJobTimeout, cr.StallTimeout)
	}
	if cr.PauseProbeInterval < 0 || (cr.PauseProbeInterval > 0 && cr.PauseProbeInterval < minInterval) {
		// Shorter, nearly every job would probe a spend-capped credential: no pause at all.
		bad(f+".pause_probe_interval", "must be at least 100ms, or 0 (off), got %s", cr.PauseProbeInterval)
	}
	cr.Batch.validate(f+".batch", bad)
}

func (c *Config) resolveSecrets(getenv func(string) string) error {
	for i := range c.Credentials {
		cr := &c.Credentials[i]
		f := fmt.Sprintf("credentials[%d]", i)
		switch {
		case cr.APIKeyEnv != "":
			// Trimmed as a file's key is: an env file written with CRLF leaves a \r behind.
			key := strings.TrimSpace(getenv(cr.APIKeyEnv))
			if key == "" {
				return fmt.Errorf("%s.api_key_env: environment variable %s is not set or empty", f, cr.APIKeyEnv)
			}
			if badKey(key) {
				return fmt.Errorf("%s.api_key_env: the key in %s holds white space or a control character", f, cr.APIKeyEnv)
			}
			cr.apiKey = &key
		case cr.APIKeyFile != "":
			b, err := os.ReadFile(cr.APIKeyFile)
			if err != nil {
				return fmt.Errorf("%s.api_key_file: cannot read %q: %w", f, cr.APIKeyFile, errors.Unwrap(err))
			}
			key := strings.TrimSpace(string(b))
			if key == "" {
				return fmt.Errorf("%s.api_key_file: %q is empty", f, cr.APIKeyFile)
			}
			if badKey(key) {
				return fmt.Errorf("%s.api_key_file: the key in %q holds white space or a control character", f, cr.APIKeyFile)
			}
			cr.apiKey = &key
		}
	}
	// With the keys read, two variables or files that hold one key share its limit too.
	var errs []error
	c.checkSharedLimits(Credential.LimiterID, func(field, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s: %s", field, fmt.Sprintf(format, args...)))
	})
	return errors.Join(errs...)
}

// badKey reports whether key holds a byte no HTTP header value may (a control character) or a
// space: no provider's key does, and the calls would fail one by one instead of at start.
func badKey(key string) bool {
	return strings.ContainsFunc(key, func(r rune) bool { return r <= ' ' || r == 0x7f })
}

// Credential returns the named credential.
func (c *Config) Credential(name string) (Credential, bool) {
	for _, cr := range c.Credentials {
		if cr.Name == name {
			return cr, true
		}
	}
	return Credential{}, false
}

func or(v, def string) string {
	if v == "" {
		return def
	}
	return v
}

func orDuration(v, def time.Duration) time.Duration {
	if v == 0 {
		return def
	}
	return v
}
