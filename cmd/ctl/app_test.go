package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/llmq/llmq/internal/jobs"
	"github.com/llmq/llmq/internal/pgtest"
	"github.com/llmq/llmq/internal/redistest"
	"github.com/llmq/llmq/migrations"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// unreachableURL is a Postgres URL on a port nothing listens on.
const unreachableURL = "postgres://postgres@127.0.0.1:1/x?sslmode=disable"

// result is one in-process run of ctl.
type result struct {
	code        int
	out, errOut string
}

// run runs ctl in-process with args (without the program name), bounded by a generous timeout.
func run(t *testing.T, args ...string) result {
	t.Helper()
	r, _ := runTimeout(30*time.Second, args...)
	return r
}

// cliMu serialises runs of ctl. urfave/cli v2 mutates package-level flags (cli.HelpFlag's Apply
// writes its default), so two apps running at once race; the binary only ever runs one.
var cliMu sync.Mutex

// runTimeout runs ctl with a context that expires after timeout (counted once the run starts)
// and reports whether it expired.
func runTimeout(timeout time.Duration, args ...string) (r result, expired bool) {
	return runApp(timeout, nil, args...)
}

// runApp is runTimeout with the app changed by configure (when not nil) before it runs.
func runApp(timeout time.Duration, configure func(*app), args ...string) (r result, expired bool) {
	var out, errOut bytes.Buffer
	cliMu.Lock()
	defer cliMu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	a := newApp(&out, &errOut)
	if configure != nil {
		configure(a)
	}
	code := a.run(ctx, append([]string{"ctl"}, args...))
	return result{code: code, out: out.String(), errOut: errOut.String()}, ctx.Err() != nil
}

// requireOneLineError checks a failed run: the exit code, nothing on the output, and exactly one
// line on the error output, starting with "ctl: " and containing want.
func requireOneLineError(t *testing.T, r result, code int, want string) {
	t.Helper()
	require.Equal(t, code, r.code, "stdout %q stderr %q", r.out, r.errOut)
	require.True(t, strings.HasSuffix(r.errOut, "\n"), "error output %q", r.errOut)
	require.Equal(t, 1, strings.Count(r.errOut, "\n"), "one line: %q", r.errOut)
	require.True(t, strings.HasPrefix(r.errOut, "ctl: "), "error output %q", r.errOut)
	require.Contains(t, r.errOut, want)
}

// jobsBundle is a migrated database with its URL, a pool on it and a job store.
type jobsBundle struct {
	url   string
	pool  *pgxpool.Pool
	store *jobs.Store
}

func setupJobs(t *testing.T) *jobsBundle {
	t.Helper()
	u := pgtest.URL(t)
	pool, err := pgxpool.New(context.Background(), u)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return &jobsBundle{url: u, pool: pool, store: jobs.NewStore(pool, nil)}
}

func (b *jobsBundle) createJob(t *testing.T) *jobs.Job {
	t.Helper()
	job, replayed, err := b.store.Create(context.Background(), jobs.CreateParams{
		Tenant:      "default",
		Credential:  "default",
		Fingerprint: "x",
		Request:     json.RawMessage(`{"model":"m"}`),
		MaxAttempts: 3,
		Timeout:     time.Minute,
	})
	require.NoError(t, err)
	require.False(t, replayed)
	return job
}

func TestMigrate_UpToDate(t *testing.T) {
	t.Parallel()

	r := run(t, "--database-url", pgtest.URL(t), "migrate")
	require.Equal(t, 0, r.code, "stderr %q", r.errOut)
	require.Equal(t, "schema is up to date\n", r.out)
	require.Empty(t, r.errOut)
}

func TestMigrate_CreatesDatabase(t *testing.T) {
	t.Parallel()

	base := pgtest.URL(t)
	u, err := url.Parse(base)
	require.NoError(t, err)
	name := "llmq_ctl_test_" + redistest.Rand()
	u.Path = "/" + name
	fresh := u.String()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		conn, err := pgx.Connect(ctx, base)
		if err != nil {
			t.Errorf("drop %s: %v", name, err)
			return
		}
		defer conn.Close(ctx)
		if _, err := conn.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)"); err != nil {
			t.Errorf("drop %s: %v", name, err)
		}
	})

	r := run(t, "--database-url", fresh, "migrate")
	require.Equal(t, 0, r.code, "stderr %q", r.errOut)
	var want strings.Builder
	for _, m := range migrations.All() {
		fmt.Fprintf(&want, "applied migration %03d\n", m.Version)
	}
	require.Equal(t, want.String(), r.out)
	require.Empty(t, r.errOut)

	// The schema is there, and a second run has nothing to do.
	conn, err := pgx.Connect(context.Background(), fresh)
	require.NoError(t, err)
	var tables int
	err = conn.QueryRow(context.Background(),
		`SELECT count(*) FROM information_schema.tables WHERE table_name IN ('jobs', 'idempotency_keys', 'job_attempts', 'job_events')`).Scan(&tables)
	require.NoError(t, conn.Close(context.Background()))
	require.NoError(t, err)
	require.Equal(t, 4, tables)

	r = run(t, "--database-url", fresh, "migrate")
	require.Equal(t, 0, r.code, "stderr %q", r.errOut)
	require.Equal(t, "schema is up to date\n", r.out)
}

func TestJobsShow(t *testing.T) {
	t.Parallel()

	t.Run("Table", func(t *testing.T) {
		t.Parallel()
		b := setupJobs(t)
		job := b.createJob(t)

		r := run(t, "--database-url", b.url, "jobs", "show", job.ID)
		require.Equal(t, 0, r.code, "stderr %q", r.errOut)
		require.Empty(t, r.errOut)
		rows := fields(r.out)
		require.Equal(t, job.ID, rows["id"])
		require.Equal(t, "queued", rows["status"])
		require.Equal(t, "default", rows["credential"])
		require.Equal(t, "normal", rows["priority"])
		require.Equal(t, "0/3", rows["attempts"])
		require.Equal(t, fmt.Sprint(len(`{"model":"m"}`)), rows["request bytes"])
		require.Equal(t, "0", rows["result bytes"])
		require.NotContains(t, r.out, "ATTEMPT", "no attempts table before any attempt")
	})

	t.Run("JSON", func(t *testing.T) {
		t.Parallel()
		b := setupJobs(t)
		job := b.createJob(t)

		r := run(t, "--database-url", b.url, "jobs", "show", "--json", job.ID)
		require.Equal(t, 0, r.code, "stderr %q", r.errOut)
		require.Empty(t, r.errOut)
		var got struct {
			Job struct {
				ID          string `json:"id"`
				Status      string `json:"status"`
				Credential  string `json:"credential"`
				Priority    string `json:"priority"`
				MaxAttempts int    `json:"max_attempts"`
				Timeout     string `json:"timeout"`
			} `json:"job"`
			Attempts []json.RawMessage `json:"attempts"`
		}
		require.NoError(t, json.Unmarshal([]byte(r.out), &got), "output %q", r.out)
		require.Equal(t, job.ID, got.Job.ID)
		require.Equal(t, "queued", got.Job.Status)
		require.Equal(t, "default", got.Job.Credential)
		require.Equal(t, "normal", got.Job.Priority)
		require.Equal(t, 3, got.Job.MaxAttempts)
		require.Equal(t, "1m0s", got.Job.Timeout)
		require.Empty(t, got.Attempts)
	})

	t.Run("WithAttempts", func(t *testing.T) {
		t.Parallel()
		b := setupJobs(t)
		job := b.createJob(t)
		ctx := context.Background()
		_, err := b.store.BeginAttempt(ctx, job.ID)
		require.NoError(t, err)
		retryAfter, delay := 2*time.Second, 3*time.Second
		applied, err := b.store.Finish(ctx, job.ID, &jobs.Attempt{
			Number: 1, Credential: "default", StartedAt: time.Now(), Latency: 120 * time.Millisecond,
			StatusCode: 429, Class: "rate_limited", RetryAfter: &retryAfter, Delay: &delay, Error: "slow down",
		}, jobs.Outcome{
			Status:    jobs.StatusRetrying,
			LastError: &jobs.LastError{Class: "rate_limited", Status: 429, Message: "slow down"},
		})
		require.NoError(t, err)
		require.True(t, applied)

		r := run(t, "--database-url", b.url, "jobs", "show", job.ID)
		require.Equal(t, 0, r.code, "stderr %q", r.errOut)
		rows := fields(r.out)
		require.Equal(t, "retrying", rows["status"])
		require.Equal(t, "1/3", rows["attempts"])
		require.Equal(t, "rate_limited 429: slow down", rows["last error"])
		require.Regexp(t, `(?m)^ATTEMPT\s+STARTED\s+STATUS\s+CLASS\s+RETRY-AFTER\s+DELAY\s+LATENCY\s+USAGE$`, r.out)
		require.Regexp(t, `(?m)^1\s+\S+\s+429\s+rate_limited\s+2s\s+3s\s+120ms\s+-$`, r.out)

		r = run(t, "--database-url", b.url, "jobs", "show", "--json", job.ID)
		require.Equal(t, 0, r.code, "stderr %q", r.errOut)
		var got struct {
			Job struct {
				Status    string `json:"status"`
				LastError struct {
					Status int `json:"status"`
				} `json:"last_error"`
			} `json:"job"`
			Attempts []jobs.AttemptRow `json:"attempts"`
		}
		require.NoError(t, json.Unmarshal([]byte(r.out), &got))
		require.Equal(t, "retrying", got.Job.Status)
		require.Equal(t, 429, got.Job.LastError.Status)
		require.Len(t, got.Attempts, 1)
		require.Equal(t, "rate_limited", got.Attempts[0].Class)
	})

	t.Run("ViaConfigFile", func(t *testing.T) {
		t.Parallel()
		b := setupJobs(t)
		job := b.createJob(t)
		dir := t.TempDir()
		keyFile := filepath.Join(dir, "key")
		require.NoError(t, os.WriteFile(keyFile, []byte("k\n"), 0o600))
		cfgFile := filepath.Join(dir, "llmq.yaml")
		require.NoError(t, os.WriteFile(cfgFile, fmt.Appendf(nil, `database_url: %q
credentials:
  - { name: default, provider: anthropic, base_url: "http://127.0.0.1:8090", api_key_file: %q }
`, b.url, keyFile), 0o600))

		r := run(t, "--config", cfgFile, "jobs", "show", job.ID)
		require.Equal(t, 0, r.code, "stderr %q", r.errOut)
		require.Equal(t, job.ID, fields(r.out)["id"])
	})

	t.Run("UnknownID", func(t *testing.T) {
		t.Parallel()
		b := setupJobs(t)
		const id = "0190a5b2-7c1e-7d3f-9a8b-123456789abc"
		r := run(t, "--database-url", b.url, "jobs", "show", id)
		requireOneLineError(t, r, 1, id)
		require.Contains(t, r.errOut, "no job")
		require.Empty(t, r.out)
	})

	t.Run("MalformedID", func(t *testing.T) {
		t.Parallel()
		b := setupJobs(t)
		r := run(t, "--database-url", b.url, "jobs", "show", "not-a-uuid")
		requireOneLineError(t, r, 1, `no job "not-a-uuid"`)
		require.Empty(t, r.out)
	})
}

// fields parses the key/value table of `jobs show` (columns separated by two or more spaces).
func fields(out string) map[string]string {
	m := map[string]string{}
	for _, line := range strings.Split(out, "\n") {
		if line == "" {
			break // the attempts table follows a blank line
		}
		k, v, ok := strings.Cut(line, "  ")
		if ok {
			m[k] = strings.TrimSpace(v)
		}
	}
	return m
}

func TestUsageErrors(t *testing.T) {
	t.Parallel()

	for name, args := range map[string][]string{
		"NoArgs":          nil,
		"UnknownCommand":  {"bogus"},
		"UnknownFlag":     {"--nope", "migrate"},
		"JobsNoSubcmd":    {"jobs"},
		"JobsUnknown":     {"jobs", "bogus"},
		"ShowNoID":        {"jobs", "show"},
		"ShowTwoIDs":      {"jobs", "show", "a", "b"},
		"ShowUnknownFlag": {"jobs", "show", "--bad", "x"},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			// No database is contacted for a usage error, so an unreachable one is fine.
			r := run(t, append([]string{"--database-url", unreachableURL}, args...)...)
			requireOneLineError(t, r, 2, "")
		})
	}
}

func TestHelp(t *testing.T) {
	t.Parallel()

	for name, args := range map[string][]string{
		"Command":  {"help"},
		"Flag":     {"--help"},
		"JobsFlag": {"jobs", "--help"},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			r := run(t, args...)
			require.Equal(t, 0, r.code, "stderr %q", r.errOut)
			require.Contains(t, r.out, "USAGE")
			require.Empty(t, r.errOut)
		})
	}
}

func TestUnreachableDatabase(t *testing.T) {
	t.Parallel()

	for name, args := range map[string][]string{
		"JobsShow": {"--database-url", unreachableURL, "jobs", "show", "0190a5b2-7c1e-7d3f-9a8b-123456789abc"},
		"Migrate":  {"--database-url", unreachableURL, "migrate"},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			r, expired := runTimeout(5*time.Second, args...)
			require.False(t, expired, "ctl waited for the timeout instead of failing fast")
			requireOneLineError(t, r, 1, "postgres unreachable")
			require.Empty(t, r.out)
		})
	}
}

func TestMissingConfigFile(t *testing.T) {
	t.Parallel()

	path := filepath.Join(t.TempDir(), "absent.yaml")
	r := run(t, "--config", path, "migrate")
	requireOneLineError(t, r, 1, path)
}

// TestInvalidConfigFileIsOneLine: every problem of the file on one line; a line that introduces
// the next (yaml's "unmarshal errors:", pgx's "failed to connect to ...:") goes on after a space,
// not "; ", which read "unmarshal errors:; retry.max_atempts: ...".
func TestInvalidConfigFileIsOneLine(t *testing.T) {
	t.Parallel()

	for name, tc := range map[string]struct {
		doc  string
		want []string
	}{
		"Invalid": {"database_url: mysql://x/y\nredis_url: http://x\ncredentials: []\n",
			[]string{"database_url", "redis_url", "credentials"}},
		"WrongKind": {"retry: { max_atempts: 5, base_delay: 30 }\n",
			[]string{"unmarshal errors: retry.max_atempts: line 1: unknown key max_atempts (did you mean max_attempts?); retry.base_delay: line 1:"}},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			path := filepath.Join(t.TempDir(), "bad.yaml")
			require.NoError(t, os.WriteFile(path, []byte(tc.doc), 0o600))
			r := run(t, "--config", path, "migrate")
			requireOneLineError(t, r, 1, tc.want[0])
			for _, w := range tc.want[1:] {
				require.Contains(t, r.errOut, w)
			}
			require.NotContains(t, r.errOut, ":;")
		})
	}
}

// TestMalformedRedisURLHidesPassword: a Redis URL that does not parse (--redis-url, or
// LLMQ_REDIS_URL, which ctl takes unchecked) is refused in one line naming the problem, without
// its password: before, the parser's error quoted the whole URL onto the terminal (and into any
// log of a scripted ctl).
func TestMalformedRedisURLHidesPassword(t *testing.T) {
	t.Parallel()
	for _, u := range []string{
		"redis://:hunter2secret@local host:6379/0",
		"redis://:hunter2secret%zz@localhost:6379/0",
		"redis-cluster://:hunter2secret@a b:7000,c:7001",
	} {
		r := run(t, "--redis-url", u, "--queue", "llmq", "stats")
		requireOneLineError(t, r, 1, "parse redis")
		require.NotContains(t, r.errOut, "hunter2secret", "the password of %q", u)
	}
}

// TestJobsShow_ModelWithEscapesIsQuoted: the request's model is the tenant's text; one holding
// terminal escape sequences (a window title, the clipboard: OSC 52) or other unprintable
// characters is shown quoted and escaped, never written raw to the operator's terminal.
func TestJobsShow_ModelWithEscapesIsQuoted(t *testing.T) {
	t.Parallel()
	b := setupJobs(t)
	job, _, err := b.store.Create(context.Background(), jobs.CreateParams{
		Tenant: "default", Credential: "default", Fingerprint: "x",
		Request:     json.RawMessage(`{"model":"m\u001b]52;c;ZWNobyBwd25lZA==\u0007\u202e"}`),
		MaxAttempts: 3, Timeout: time.Minute,
	})
	require.NoError(t, err)
	r := run(t, "--database-url", b.url, "jobs", "show", job.ID)
	require.Equal(t, 0, r.code, "stderr %q", r.errOut)
	require.NotContains(t, r.out, "\x1b")
	require.NotContains(t, r.out, "\a")
	require.NotContains(t, r.out, "\u202e")
	require.Equal(t, `"m\x1b]52;c;ZWNobyBwd25lZA==\a\u202e"`, fields(r.out)["model"])

	job = b.createJob(t)
	r = run(t, "--database-url", b.url, "jobs", "show", job.ID)
	require.Equal(t, "m", fields(r.out)["model"], "a plain model as it is")
}

// TestJobsShow_LastErrorWithUnprintablesIsQuoted: a job's last error holds the provider's
// message, which quotes the tenant's text (OpenAI "The model `...` does not exist", Anthropic
// "model: ..."); the provider text is cleaned of control characters other than white space, but a
// bidirectional override or a carriage return (which rewrites the line on the terminal) passes.
// Shown by `ctl jobs show` or `ctl dead list`, it is quoted and escaped, as the model is.
func TestJobsShow_LastErrorWithUnprintablesIsQuoted(t *testing.T) {
	t.Parallel()
	b := setupJobs(t)
	job, _, err := b.store.Create(context.Background(), jobs.CreateParams{
		Tenant: "default", Credential: "default", Fingerprint: "x",
		Request: json.RawMessage(`{"model":"m"}`), MaxAttempts: 1, Timeout: time.Minute,
	})
	require.NoError(t, err)
	msg := "The model `m\u202eexe.txt` does not exist\rall good"
	b.attempt(t, job.ID, jobs.Outcome{Status: jobs.StatusDead, DeadReason: "permanent_error",
		LastError: &jobs.LastError{Class: "permanent", Status: 404, Message: msg}})

	r := run(t, "--database-url", b.url, "jobs", "show", job.ID)
	require.Equal(t, 0, r.code, "stderr %q", r.errOut)
	require.NotContains(t, r.out, "\u202e")
	require.NotContains(t, r.out, "\r")
	require.Equal(t, strconv.Quote("permanent 404: "+msg), fields(r.out)["last error"])

	r = run(t, "--database-url", b.url, "dead", "list")
	require.Equal(t, 0, r.code, "stderr %q", r.errOut)
	require.NotContains(t, r.out, "\u202e")
	require.Contains(t, r.out, `\u202e`)
}

// TestMigrate_ReportsWhatItAppliedBeforeAFailure runs migrate on a database two versions behind
// whose last migration fails (a relation of its name is there already): the output names the
// version that was applied and committed before the failure, not nothing.
func TestMigrate_ReportsWhatItAppliedBeforeAFailure(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	dbURL := pgtest.URL(t)
	conn, err := pgx.Connect(ctx, dbURL)
	require.NoError(t, err)
	defer conn.Close(context.WithoutCancel(ctx))
	all := migrations.All()
	last, before := all[len(all)-1], all[len(all)-2]
	for _, m := range []migrations.Migration{last, before} {
		down, err := os.ReadFile(fmt.Sprintf("../../migrations/%03d_%s.down.sql", m.Version, m.Name))
		require.NoError(t, err)
		_, err = conn.Exec(ctx, string(down))
		require.NoError(t, err)
		_, err = conn.Exec(ctx, "DELETE FROM schema_migrations WHERE version = $1", m.Version)
		require.NoError(t, err)
	}
	// The last migration (024) makes this table: a relation of its name fails it. A new last
	// migration needs its own conflict here.
	_, err = conn.Exec(ctx, "CREATE TABLE provider_batch_files (x int)")
	require.NoError(t, err)

	r := run(t, "--database-url", dbURL, "migrate")
	require.Equal(t, 1, r.code)
	require.Equal(t, fmt.Sprintf("applied migration %03d\n", before.Version), r.out)
	require.Contains(t, r.errOut, fmt.Sprintf("apply migration %03d_%s", last.Version, last.Name))
}

// TestMissingDatabase_SaysMigrateCreatesIt: a command on a database that does not exist (a new
// deployment's, or a typo in --database-url) says that `ctl migrate` creates it, as it says of a
// database without llmq's schema; it printed Postgres's error alone.
func TestMissingDatabase_SaysMigrateCreatesIt(t *testing.T) {
	t.Parallel()
	u, err := url.Parse(pgtest.URL(t))
	require.NoError(t, err)
	u.Path += "_absent" // never created: nothing to drop
	for _, args := range [][]string{{"jobs", "list"}, {"dead", "list"}, {"audit"}} {
		r := run(t, append([]string{"--database-url", u.String()}, args...)...)
		requireOneLineError(t, r, 1, "does not exist")
		require.Contains(t, r.errOut, "check --database-url, or run `ctl migrate`, which creates it", args)
	}
}

// TestNegativeTimeoutIsAUsageError: a negative --timeout (a typo) is refused; it bounded nothing,
// as --timeout 0 does, so that a command on a silent Postgres hung instead of failing.
func TestNegativeTimeoutIsAUsageError(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{{"jobs", "list"}, {"dead", "retry", "--all"}, {"migrate"}} {
		r := run(t, append([]string{"--database-url", "postgres://postgres@127.0.0.1:1/none", "--timeout", "-5s"}, args...)...)
		requireOneLineError(t, r, 2, `--timeout -5s: want 0 (none) or a positive duration`)
	}
}
