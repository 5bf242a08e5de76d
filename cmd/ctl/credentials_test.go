package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/config"
	"github.com/llmq/llmq/internal/credpause"
	"github.com/llmq/llmq/internal/limiter"
	"github.com/llmq/llmq/internal/redistest"
)

func TestCredentials_ListAndResume(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	keyFile := filepath.Join(dir, "key")
	require.NoError(t, os.WriteFile(keyFile, []byte("sk-ctl-test\n"), 0o600))
	cfgFile := filepath.Join(dir, "llmq.yaml")
	b := setupJobs(t) // the audit log's database, named by the config
	require.NoError(t, os.WriteFile(cfgFile, fmt.Appendf(nil, `
database_url: %s
redis_url: %s
credentials:
  - { name: main, provider: anthropic, base_url: "http://127.0.0.1:1", api_key_file: %s, limits: { requests_per_second: 10, burst: 20 } }
  - { name: spare, provider: openai, base_url: "http://127.0.0.1:2", api_key_file: %s }
`, b.url, redistest.URL(), keyFile, keyFile), 0o600))
	prefix := redistest.Prefix(t)
	args := []string{"--config", cfgFile, "--redis-prefix", prefix, "credentials"}

	// Given "main" paused by a spend cap, as a worker would have done (in Postgres and Redis),
	cfg, err := config.Load(cfgFile, nil)
	require.NoError(t, err)
	lim, err := limiter.New(redistest.Client(t), &limiter.Config{Prefix: prefix})
	require.NoError(t, err)
	mainCred, _ := cfg.Credential("main")
	pauses := credpause.NewStore(b.pool, nil)
	started, err := pauses.Pause(t.Context(), lim.Gate(mainCred.LimiterID(), "main"), "rate_limited_no_retry_after", "job-1")
	require.NoError(t, err)
	require.True(t, started)
	// and "spare" pushed back by a 429 asking for 300 s.
	spareCred, _ := cfg.Credential("spare")
	observing := time.Now()
	require.NoError(t, lim.Gate(spareCred.LimiterID(), "spare").Observe(t.Context(), limiter.Observation{
		StatusCode: 429, RetryAfter: 300 * time.Second, HasRetryAfter: true}))
	observed := time.Now()

	type row struct {
		Name       string  `json:"name"`
		Source     string  `json:"limit_source"`
		Rate       float64 `json:"requests_per_second"`
		Burst      int     `json:"burst"`
		Paused     bool    `json:"paused"`
		FirstJobID string  `json:"pause_first_job_id"`
		PushReason string  `json:"push_back_reason"`
		Breaker    string  `json:"breaker"`
	}
	list := func() []row {
		r := run(t, append(args, "list", "--json")...)
		require.Equal(t, 0, r.code, r.errOut)
		var rows []row
		require.NoError(t, json.Unmarshal([]byte(r.out), &rows))
		return rows
	}

	// then list shows its configured limit and the pause, and the other credential's push-back:
	// until when, and why.
	rows := list()
	require.Len(t, rows, 2)
	require.Equal(t, row{Name: "main", Source: "configured", Rate: 10, Burst: 20, Paused: true, FirstJobID: "job-1", Breaker: "closed"}, rows[0])
	require.Equal(t, row{Name: "spare", Source: "unknown", PushReason: "Retry-After 300s from a 429", Breaker: "closed"}, rows[1])
	var raw []map[string]any
	require.NoError(t, json.Unmarshal([]byte(run(t, append(args, "list", "--json")...).out), &raw))
	until, err := time.Parse(time.RFC3339Nano, raw[1]["pushed_back_until"].(string))
	require.NoError(t, err)
	// 300 s from the 429's observation (on Redis's clock, the host's here): counted from the
	// test's clock at the check, the margin was what the two lists took, which a loaded run can
	// spend.
	require.WithinRange(t, until, observing.Add(300*time.Second-time.Second), observed.Add(300*time.Second+time.Second))
	table := run(t, append(args, "list")...)
	require.Equal(t, 0, table.code)
	require.Contains(t, table.out, "10/s burst 20")
	require.Contains(t, table.out, "rate_limited_no_retry_after, first job job-1")
	require.Contains(t, table.out, "until "+until.Format(time.RFC3339)+" (Retry-After 300s from a 429)")

	// Without the Postgres its audit entry goes to, the resume is not made.
	requireOneLineError(t, run(t, append([]string{"--database-url", unreachableURL}, append(args, "resume", "main")...)...),
		1, "postgres unreachable")
	require.True(t, list()[0].Paused, "still paused")

	// When the operator resumes it, it is no longer paused, in Postgres either (a Redis that
	// lost its data would get the pause back from there); resuming again says so.
	r := run(t, append(args, "resume", "main")...)
	require.Equal(t, 0, r.code, r.errOut)
	require.Equal(t, "credential main resumed\n", r.out)
	require.False(t, list()[0].Paused)
	kept, err := pauses.Get(t.Context(), lim.Gate(mainCred.LimiterID(), "main"))
	require.NoError(t, err)
	require.False(t, kept.Paused, "the pause Postgres keeps outlived the resume")
	r = run(t, append(args, "resume", "main")...)
	require.Equal(t, "credential main was neither paused nor pushed back\n", r.out)

	// Resuming "spare" clears its push-back.
	r = run(t, append(args, "resume", "spare")...)
	require.Equal(t, 0, r.code, r.errOut)
	require.Equal(t, "credential spare resumed: cleared its push-back until "+until.Format(time.RFC3339)+" (Retry-After 300s from a 429)\n", r.out)
	require.Empty(t, list()[1].PushReason)
	r = run(t, append(args, "resume", "spare")...)
	require.Equal(t, "credential spare was neither paused nor pushed back\n", r.out)

	// The two resumes that changed something are in the audit log.
	var resumed []string
	for _, e := range auditLog(t, b.url) {
		require.Equal(t, "credential.resume", e.Action)
		resumed = append(resumed, e.Target)
	}
	require.Equal(t, []string{"spare", "main"}, resumed)

	requireOneLineError(t, run(t, append(args, "resume", "nope")...), 2, `no credential "nope"`)
	require.Equal(t, 2, run(t, append(args, "resume")...).code)
	requireOneLineError(t, run(t, "credentials", "list"), 2, "need --config")

	// --redis-url overrides the config file's, as for every command.
	text, err := os.ReadFile(cfgFile)
	require.NoError(t, err)
	elsewhere := filepath.Join(dir, "elsewhere.yaml")
	require.NoError(t, os.WriteFile(elsewhere, []byte(strings.Replace(string(text), redistest.URL(), "redis://127.0.0.1:1/0", 1)), 0o600))
	requireOneLineError(t, run(t, "--config", elsewhere, "--redis-prefix", prefix, "credentials", "list"), 1, "redis unreachable")
	r = run(t, "--config", elsewhere, "--redis-url", redistest.URL(), "--redis-prefix", prefix, "credentials", "list", "--json")
	require.Equal(t, 0, r.code, r.errOut)
	require.Contains(t, r.out, `"name": "spare"`)
}

// Right after Redis lost its data, list tells a credential paused by a spend cap as paused
// (Postgres keeps the pause), not as not paused until a worker's refresh restores it.
func TestCredentials_ListReadsAPauseRedisLost(t *testing.T) {
	t.Parallel()
	cb := setupCredentials(t, "sk-ctl-lost", `
  - { name: main, provider: anthropic, base_url: "http://127.0.0.1:1", api_key_file: %[1]s }`)
	b, cfgFile, prefix := cb.jobs, cb.cfgFile, cb.prefix
	mainCred, _ := cb.cfg.Credential("main")
	gate := cb.lim.Gate(mainCred.LimiterID(), "main")
	_, err := credpause.NewStore(b.pool, nil).Pause(t.Context(), gate, "rate_limited_no_retry_after", "job-1")
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	redistest.Unlink(ctx, redistest.Client(t), prefix+"*") // Redis loses its data

	r := run(t, "--config", cfgFile, "--redis-prefix", prefix, "credentials", "list", "--json")
	require.Equal(t, 0, r.code, r.errOut)
	var rows []struct {
		Paused     bool   `json:"paused"`
		FirstJobID string `json:"pause_first_job_id"`
	}
	require.NoError(t, json.Unmarshal([]byte(r.out), &rows))
	require.Len(t, rows, 1)
	require.True(t, rows[0].Paused, "a pause Postgres keeps shows as not paused after Redis lost it")
	require.Equal(t, "job-1", rows[0].FirstJobID)
	ps, err := gate.Paused(t.Context())
	require.NoError(t, err)
	require.True(t, ps.Paused, "the pause is back in Redis")
}

// TestCredentials_ListShowsTokenLimits: list shows each token bucket in force (input and output
// tokens per minute, where the limit came from), as the console's credentials page does, in its
// table and its JSON; a credential without one shows "-" and an empty list. list showed none.
func TestCredentials_ListShowsTokenLimits(t *testing.T) {
	t.Parallel()
	cb := setupCredentials(t, "sk-ctl-tokens", `
  - { name: main, provider: anthropic, base_url: "http://127.0.0.1:1", api_key_file: %[1]s }
  - { name: spare, provider: anthropic, base_url: "http://127.0.0.1:2", api_key_file: %[1]s }`)
	cfgFile, prefix, lim := cb.cfgFile, cb.prefix, cb.lim
	// Given an answer on "main" that reported its input and output token limits,
	mainCred, _ := cb.cfg.Credential("main")
	now := time.Now()
	bucket := func(limit int) limiter.TokenObservation {
		return limiter.TokenObservation{Known: true, Limit: limit, Remaining: limit, ResetAt: now.Add(time.Second),
			ResetAbsolute: true}
	}
	require.NoError(t, lim.Gate(mainCred.LimiterID(), "main").Observe(t.Context(), limiter.Observation{
		At: now, SentAt: now, StatusCode: 200, InputTokens: bucket(40000), OutputTokens: bucket(8000)}))

	// then list names both, learned; "spare" has none.
	args := []string{"--config", cfgFile, "--redis-prefix", prefix, "credentials", "list"}
	r := run(t, append(args, "--json")...)
	require.Equal(t, 0, r.code, r.errOut)
	type tokenLimit struct {
		Bucket    string  `json:"bucket"`
		PerMinute float64 `json:"per_minute"`
		Source    string  `json:"source"`
	}
	var rows []struct {
		Name        string       `json:"name"`
		TokenLimits []tokenLimit `json:"token_limits"`
	}
	require.NoError(t, json.Unmarshal([]byte(r.out), &rows))
	require.Len(t, rows, 2)
	require.Equal(t, []tokenLimit{{"input", 40000, "learned"}, {"output", 8000, "learned"}}, rows[0].TokenLimits)
	require.NotNil(t, rows[1].TokenLimits, "none: an empty list, as the console's")
	require.Empty(t, rows[1].TokenLimits)
	table := run(t, args...)
	require.Equal(t, 0, table.code, table.errOut)
	lines := tableRows(table.out)
	require.Len(t, lines, 3, table.out)
	require.Equal(t, "TOKEN LIMITS", lines[0][4], table.out)
	require.Equal(t, "input 40000/min (learned), output 8000/min (learned)", lines[1][4], table.out)
	require.Equal(t, "-", lines[2][4], table.out)
}

// credentialsBundle is a config file naming credentials, its database (setupJobs), a Redis
// prefix of the test's own, and a limiter on it.
type credentialsBundle struct {
	jobs    *jobsBundle
	cfgFile string
	prefix  string
	cfg     *config.Config
	lim     *limiter.Limiter
}

// setupCredentials writes a config whose credentials are the YAML list items credentials (%[1]s
// in it is the path of a key file holding key) and loads it.
func setupCredentials(t *testing.T, key, credentials string) *credentialsBundle {
	t.Helper()
	dir := t.TempDir()
	keyFile := filepath.Join(dir, "key")
	require.NoError(t, os.WriteFile(keyFile, []byte(key+"\n"), 0o600))
	b := &credentialsBundle{jobs: setupJobs(t), cfgFile: filepath.Join(dir, "llmq.yaml"), prefix: redistest.Prefix(t)}
	require.NoError(t, os.WriteFile(b.cfgFile, fmt.Appendf(nil, "database_url: %s\nredis_url: %s\ncredentials:%s\n",
		b.jobs.url, redistest.URL(), fmt.Sprintf(credentials, keyFile)), 0o600))
	var err error
	b.cfg, err = config.Load(b.cfgFile, nil)
	require.NoError(t, err)
	b.lim, err = limiter.New(redistest.Client(t), &limiter.Config{Prefix: b.prefix})
	require.NoError(t, err)
	return b
}
