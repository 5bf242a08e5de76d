package e2e_test

import (
	"context"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/api"
	"github.com/llmq/llmq/internal/openapitest"
	"github.com/llmq/llmq/internal/operator"
	"github.com/llmq/llmq/internal/tenant"
)

// TestConsole_Browser runs the console's browser suite (test/browser/console.test.mjs:
// playwright-core driving Debian's Chromium, both installed by scripts/browser.sh) against a stack
// of its own: log in (a tenant token refused), the overview's counts, a dead letter appearing live
// when a spend cap hits, its attempts, canceling a waiting job from its page (counted in the API's
// metrics), resuming the paused credential while a waiting job's page goes live to succeeded,
// retrying the dead letter after a confirmation that names the count, purging a dead letter found
// by its reason, markup in a job's fields shown as text and never run (no element made of it),
// creating a tenant, setting its weight, rotating its token (both tokens working) and revoking it,
// an action without the CSRF token refused, an unknown job's message, the audit log, logout; a
// dead letter purged from its own page (the dead letters shown, not an error), one purged from
// another tab (its open page dropping its actions), a batch job's lane
// and batch state, a streaming job's request, long unbroken values wrapped within the window, an
// action the ended session refused (the login alone, nothing stale once logged in again), a server
// out of reach said in words, Filter on the filters shown loading the list again, a stale page
// link's first page, a double click on Create tenant sending one create, a revocation said
// to be on its way before its answer, and the audit log a page at a time and by operator (an unknown
// parameter and a stale page link refused). It
// also measures the overview's first load. Outages are injected in the browser (playwright's
// routes: a 503, a proxy's 502, a stream cut): the overview and a job's page first opened in one
// come back by themselves, their badge says when the stream is stale or down, a job purged while
// its stream was down is said so, another page's failed load has Try again, and a session that
// ended while the stream was down shows the login. LLMQ_SCREENSHOTS=docs/console (from the
// repository root) writes the README's screenshots; LLMQ_CONSOLE_ROWS=1000000 first fills the table
// with that many older jobs (one attempt each), to measure the overview's first load on a large
// table.
func TestConsole_Browser(t *testing.T) {
	t.Parallel()
	script, err := filepath.Abs(filepath.Join(repoRoot, "scripts", "browser.sh"))
	require.NoError(t, err)
	runBrowser(t, 10*time.Minute, nil, script) // apt-get chromium and npm ci when missing or stale

	// The batch lane on, for a batch job's page.
	b := setup(t, setupOpts{extra: "batch: { enabled: true, max_wait_to_fill: 50ms, poll_interval: 100ms }"})
	ctx := context.Background()
	pool, err := openPool(ctx, b.dbURL)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	// The console is served by an API of its own, reading the worker's keys; every answer the
	// page gets must be one that api/openapi.yaml describes (its tag console).
	srv, closeAPI, err := api.FromConfigWith(b.cfg, pool, prometheus.NewRegistry(), nil, api.Options{RedisPrefix: b.prefix})
	require.NoError(t, err)
	t.Cleanup(func() { _ = closeAPI() })
	hs := httptest.NewServer(openapitest.Handler(t, srv))
	t.Cleanup(func() {
		hs.CloseClientConnections()
		hs.Close()
	})
	if n := os.Getenv("LLMQ_CONSOLE_ROWS"); n != "" {
		seedOldJobs(t, pool, n)
	}
	_, opToken, err := operator.NewStore(pool, nil).Create(ctx, "alice")
	require.NoError(t, err)
	_, tenantToken, err := tenant.NewStore(pool, nil).Create(ctx, "someone", nil)
	require.NoError(t, err)

	env := []string{"LLMQ_CONSOLE_URL=" + hs.URL, "LLMQ_API=" + b.apiURL, "LLMQ_SIM=" + b.simURL,
		"LLMQ_OPERATOR_TOKEN=" + opToken, "LLMQ_TENANT_TOKEN=" + tenantToken}
	if dir := os.Getenv("LLMQ_SCREENSHOTS"); dir != "" {
		abs, err := filepath.Abs(filepath.Join(repoRoot, dir))
		require.NoError(t, err)
		env = append(env, "LLMQ_SCREENSHOTS="+abs)
	}
	out := runBrowser(t, 3*time.Minute, env, script, "console.test.mjs")
	t.Logf("browser suite:\n%s", out)
	require.True(t, strings.HasSuffix(strings.TrimSpace(out), "step: done"), out)
}

// runBrowser runs a program in test/browser (see runIn).
func runBrowser(t *testing.T, timeout time.Duration, env []string, name string, args ...string) string {
	t.Helper()
	return runIn(t, filepath.Join(repoRoot, "test", "browser"), timeout, env, name, args...)
}

// seedOldJobs inserts n succeeded jobs created 2 hours to 30 days ago, with an attempt each.
func seedOldJobs(t *testing.T, pool *pgxpool.Pool, n string) {
	t.Helper()
	ctx := context.Background()
	_, err := pool.Exec(ctx, `
WITH j AS (
	INSERT INTO jobs (id, credential, fingerprint, status, request, max_attempts, timeout_ms, deadline, created_at,
		finished_at, attempts)
	SELECT gen_random_uuid(), 'default', 'f', 'succeeded', '{}', 3, 60000, now(), c, c + interval '1 second', 1
	FROM generate_series(1, $1::int) g, LATERAL (SELECT now() - interval '2 hours' - g * interval '2.5 seconds' AS c) x
	RETURNING id, created_at
)
INSERT INTO job_attempts (job_id, attempt, credential, started_at, latency_ms, status_code, class)
SELECT id, 1, 'default', created_at, 800, 200, 'success' FROM j`, n)
	require.NoError(t, err)
	// What autovacuum does on a live database (it is off on the test machines): statistics,
	// and the summaries of the attempts' BRIN index.
	_, err = pool.Exec(ctx, `VACUUM ANALYZE jobs`)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `VACUUM ANALYZE job_attempts`)
	require.NoError(t, err)
}
