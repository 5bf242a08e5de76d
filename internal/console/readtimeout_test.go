package console_test

import (
	"context"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/console"
	"github.com/llmq/llmq/internal/jobs"
	"github.com/llmq/llmq/internal/jobstest"
	"github.com/llmq/llmq/internal/pgtest"
)

// TestRead_SilentDatabaseIsA503: a page whose read goes out on a connection Postgres never
// answers (a partition, a failover behind a moved address) is answered 503 unavailable at
// Config.ReadTimeout, saying the database did not answer in time. It waited as long as the
// browser did, holding a connection of the pool the API's requests share.
func TestRead_SilentDatabaseIsA503(t *testing.T) {
	t.Parallel()
	const answeredWithin = 6 * time.Second
	for name, tc := range map[string]struct {
		statement string // the read that falls silent
		path      func(job *jobs.Job) string
	}{
		"DeadList":  {"ORDER BY jobs.finished_at DESC, jobs.id DESC LIMIT", func(*jobs.Job) string { return "/console/api/dead" }},
		"JobDetail": {"FROM jobs WHERE id = $1", func(j *jobs.Job) string { return "/console/api/jobs/" + j.ID }},
		// A job page's event stream, whose context no bound may end, bounds its reads one by one.
		"JobLive": {"FROM jobs WHERE id = $1", func(j *jobs.Job) string { return "/console/api/jobs/" + j.ID + "/live" }},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			var proxy *pgtest.Proxy
			b := setupConfig(t, func(cfg *console.Config) {
				cfg.ReadTimeout = time.Second
				var proxied string
				proxy, proxied = pgtest.NewProxy(t, cfg.Pool.Config().ConnString())
				pool, err := pgxpool.New(context.Background(), proxied)
				require.NoError(t, err)
				t.Cleanup(pool.Close)
				// Before the pool's close, which waits for its connections: one left silent ends.
				t.Cleanup(proxy.Cut)
				cfg.Jobs = jobs.NewStore(pool, nil)
			})
			c := b.login(t)
			job := b.jobs.Dead(t, jobstest.Opts{}, jobs.ReasonRetriesExhausted, 1)

			ctx, cancel := context.WithTimeout(t.Context(), 15*time.Second)
			defer cancel()
			silenced := proxy.SilenceStatement(tc.statement)
			type answer struct {
				res *http.Response
				out string
				err error
			}
			done := make(chan answer, 1)
			go func() { // no require here: not the test's goroutine
				req, err := http.NewRequestWithContext(ctx, http.MethodGet, b.srv.URL+tc.path(job), nil)
				if err != nil {
					done <- answer{err: err}
					return
				}
				res, err := c.http.Do(req)
				if err != nil {
					done <- answer{err: err}
					return
				}
				defer res.Body.Close()
				out, err := io.ReadAll(res.Body)
				done <- answer{res, string(out), err}
			}()
			require.True(t, silenced(ctx), "the read was not sent")
			// Well before the bound of the store's batched reads (a job's Get: 10 s), which is
			// not the page's: at ReadTimeout, 1 s.
			answered := time.NewTimer(answeredWithin)
			defer answered.Stop()
			var a answer
			select {
			case a = <-done:
			case <-answered.C:
				t.Fatalf("the page still waits on a silent database %s after its read", answeredWithin)
			}
			require.NoError(t, a.err, "the page still waits on a silent database")
			requireError(t, a.res, a.out, http.StatusServiceUnavailable, "unavailable")
			require.Contains(t, errorMessage(t, a.out), "did not answer in time")
		})
	}
}
