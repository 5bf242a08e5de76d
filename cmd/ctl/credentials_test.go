package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/config"
	"github.com/llmq/llmq/internal/limiter"
	"github.com/llmq/llmq/internal/redistest"
)

func TestCredentials_ListAndResume(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	keyFile := filepath.Join(dir, "key")
	require.NoError(t, os.WriteFile(keyFile, []byte("sk-ctl-test\n"), 0o600))
	cfgFile := filepath.Join(dir, "llmq.yaml")
	require.NoError(t, os.WriteFile(cfgFile, fmt.Appendf(nil, `
redis_url: %s
credentials:
  - { name: main, provider: anthropic, base_url: "http://127.0.0.1:1", api_key_file: %s, limits: { requests_per_second: 10, burst: 20 } }
  - { name: spare, provider: openai, base_url: "http://127.0.0.1:2", api_key_file: %s }
`, redistest.URL(), keyFile, keyFile), 0o600))
	prefix := redistest.Prefix(t)
	args := []string{"--config", cfgFile, "--redis-prefix", prefix, "credentials"}

	// Given "main" paused by a spend cap, as a worker would have done,
	cfg, err := config.Load(cfgFile, nil)
	require.NoError(t, err)
	lim, err := limiter.New(redistest.Client(t), &limiter.Config{Prefix: prefix})
	require.NoError(t, err)
	mainCred, _ := cfg.Credential("main")
	started, err := lim.Gate(mainCred.LimiterID(), "main").Pause(t.Context(), "rate_limited_no_retry_after", "job-1")
	require.NoError(t, err)
	require.True(t, started)

	type row struct {
		Name       string  `json:"name"`
		Source     string  `json:"limit_source"`
		Rate       float64 `json:"requests_per_second"`
		Burst      int     `json:"burst"`
		Paused     bool    `json:"paused"`
		FirstJobID string  `json:"pause_first_job_id"`
		Breaker    string  `json:"breaker"`
	}
	list := func() []row {
		r := run(t, append(args, "list", "--json")...)
		require.Equal(t, 0, r.code, r.errOut)
		var rows []row
		require.NoError(t, json.Unmarshal([]byte(r.out), &rows))
		return rows
	}

	// then list shows its configured limit and the pause, and the other credential as unknown.
	rows := list()
	require.Len(t, rows, 2)
	require.Equal(t, row{Name: "main", Source: "configured", Rate: 10, Burst: 20, Paused: true, FirstJobID: "job-1", Breaker: "closed"}, rows[0])
	require.Equal(t, row{Name: "spare", Source: "unknown", Breaker: "closed"}, rows[1])
	table := run(t, append(args, "list")...)
	require.Equal(t, 0, table.code)
	require.Contains(t, table.out, "10/s burst 20")
	require.Contains(t, table.out, "rate_limited_no_retry_after, first job job-1")

	// When the operator resumes it, it is no longer paused; resuming again says so.
	r := run(t, append(args, "resume", "main")...)
	require.Equal(t, 0, r.code, r.errOut)
	require.Equal(t, "credential main resumed\n", r.out)
	require.False(t, list()[0].Paused)
	r = run(t, append(args, "resume", "main")...)
	require.Equal(t, "credential main was not paused\n", r.out)

	requireOneLineError(t, run(t, append(args, "resume", "nope")...), 1, `no credential "nope"`)
	require.Equal(t, 2, run(t, append(args, "resume")...).code)
	requireOneLineError(t, run(t, "credentials", "list"), 1, "need --config")
}
