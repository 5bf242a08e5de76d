package main

import (
	"net"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/jobs"
	"github.com/llmq/llmq/migrations"
)

// silentServer listens on a local port and accepts connections it never answers, as a Postgres
// behind a hung proxy or pooler does; it closes them when the test ends.
func silentServer(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	var mu sync.Mutex
	var conns []net.Conn
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		<-done
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			_ = c.Close()
		}
	})
	return ln.Addr().String()
}

// TestSilentDatabaseFailsFast: a Postgres that accepts the connection and never answers (a hung
// server, a pooler waiting for a server that is down) fails the command within the connect
// timeout, in one line naming Postgres; ctl waited for it forever.
func TestSilentDatabaseFailsFast(t *testing.T) {
	t.Parallel()
	u := "postgres://postgres@" + silentServer(t) + "/x?sslmode=disable"
	for name, args := range map[string][]string{
		"JobsList": {"--database-url", u, "jobs", "list"},
		"Migrate":  {"--database-url", u, "migrate"},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			r, expired := runTimeout(migrations.DefaultConnectTimeout+10*time.Second, args...)
			require.False(t, expired, "ctl waited for a Postgres that does not answer")
			requireOneLineError(t, r, 1, "postgres unreachable")
			require.Empty(t, r.out)
		})
	}
}

// TestStrayArgumentsAreUsageErrors: a command that takes no arguments refuses them (exit 2,
// nothing done) as `ctl stats x` does; `ctl migrate status` applied the pending migrations, and
// `ctl operators list alice` (and `ctl tenants list acme`) listed every one.
func TestStrayArgumentsAreUsageErrors(t *testing.T) {
	t.Parallel()
	b := setupJobs(t)
	for name, args := range map[string][]string{
		"Migrate":         {"migrate", "status"},
		"OperatorsList":   {"operators", "list", "alice"},
		"CredentialsList": {"credentials", "list", "default"},
		"TenantsList":     {"tenants", "list", "acme"},
	} {
		t.Run(name, func(t *testing.T) {
			r := run(t, append([]string{"--database-url", b.url}, args...)...)
			requireOneLineError(t, r, 2, "usage: ctl "+args[0])
			require.Empty(t, r.out)
		})
	}
}

// TestDeadReasonIsChecked: a --reason that is no dead reason is a usage error naming the two
// there are; it matched nothing, so `ctl dead retry --all --reason rate_limited` said "no dead
// jobs matched" and exited 0 with every spend-capped dead letter left dead.
func TestDeadReasonIsChecked(t *testing.T) {
	t.Parallel()
	b := setupJobs(t)
	b.deadJob(t, "default", jobs.ReasonRateLimitedNoRetryAfter, 1)
	redis, _, _ := redisArgs(t)
	for name, args := range map[string][]string{
		"List":  {"dead", "list", "--reason", "rate_limited"},
		"Retry": {"dead", "retry", "--all", "--reason", "rate_limited"},
	} {
		t.Run(name, func(t *testing.T) {
			r := run(t, append(append([]string{"--database-url", b.url}, redis...), args...)...)
			requireOneLineError(t, r, 2, `--reason "rate_limited"`)
			require.Contains(t, r.errOut, jobs.ReasonRateLimitedNoRetryAfter)
			require.Empty(t, r.out)
		})
	}
	dead, err := b.store.PageDead(t.Context(), jobs.DeadFilter{Limit: 10}, "")
	require.NoError(t, err)
	require.Len(t, dead.Jobs, 1, "the dead job is still dead")
}

// TestUnmigratedDatabaseSaysWhatToDo: a database without llmq's schema (a wrong --database-url,
// or one never migrated) failed every command with Postgres's `relation "jobs" does not exist`
// alone; the line now says to check the URL or run `ctl migrate`.
func TestUnmigratedDatabaseSaysWhatToDo(t *testing.T) {
	t.Parallel()
	b := setupJobs(t)
	_, err := b.pool.Exec(t.Context(), `DROP SCHEMA public CASCADE; CREATE SCHEMA public`)
	require.NoError(t, err)
	r := run(t, "--database-url", b.url, "jobs", "list")
	requireOneLineError(t, r, 1, `relation "jobs" does not exist`)
	require.Contains(t, r.errOut, "run `ctl migrate`")
}
