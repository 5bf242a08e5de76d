package console_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/console"
	"github.com/llmq/llmq/internal/jobs"
	"github.com/llmq/llmq/internal/redistest"
)

// statementCounter counts the statements a pool sends, by the tables they name (a pgx tracer:
// the stores are real, only their traffic is watched). It is safe for concurrent use.
type statementCounter struct {
	mu  sync.Mutex
	sql []string
}

func (c *statementCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.sql = append(c.sql, data.SQL)
	return ctx
}

func (c *statementCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// count is how many statements sent so far contain s.
func (c *statementCounter) count(s string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, q := range c.sql {
		if strings.Contains(q, s) {
			n++
		}
	}
	return n
}

// TestJobLive_ASignalOfAnEventReadReadsNothing: the job page's stream read the job (its row,
// attempts and events: three statements) at every signal of the Listener, whatever its value.
// After each reconnect the Listener signals every followed job's latest event: every open page
// read its job again, though it had read that event already. A signal of an event the page has
// read now reads nothing (the session is still checked); one of a later event reads as before.
func TestJobLive_ASignalOfAnEventReadReadsNothing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var stmts statementCounter
	pcfg, err := pgxpool.ParseConfig(b.jobs.URL)
	require.NoError(t, err)
	pcfg.ConnConfig.Tracer = &stmts
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)

	lcfg := b.jobs.Pool.Config().ConnConfig.Copy()
	appName := "llmq-console-live-test-" + redistest.Rand()
	lcfg.RuntimeParams["application_name"] = appName
	l := jobs.NewListener(jobs.ListenerConfig{ConnConfig: lcfg, ReconnectDelay: 10 * time.Millisecond})
	probe, unsubscribe := l.Subscribe("probe")
	lctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- l.Run(lctx) }()
	t.Cleanup(func() {
		stop()
		require.NoError(t, <-done)
	})
	select { // listening: no catch-up of its first connection is left to signal the page
	case <-probe:
	case <-ctx.Done():
		t.Fatal("the listener does not listen")
	}
	unsubscribe()

	job := b.jobs.Create(t, jobstestOpts())
	c, _ := b.serve(t, func(cfg *console.Config) {
		cfg.Pool, cfg.Jobs, cfg.Listener, cfg.KeepAlive = pool, jobs.NewStore(pool, nil), l, time.Hour
	})
	s := c.stream(t, "/console/api/jobs/"+job.ID+"/live", "job")
	var d struct {
		Job struct {
			Status jobs.Status `json:"status"`
		} `json:"job"`
	}
	s.next(t, &d)
	require.Equal(t, jobs.StatusQueued, d.Job.Status)
	require.Equal(t, 1, stmts.count("FROM job_attempts"), "the first read")
	sessions := stmts.count("FROM operator_sessions")

	// The Listener reconnects; its catch-up signals the page the job's latest event, which it
	// has read. The page wakes up (it checks its session), and reads nothing.
	var killed bool
	require.NoError(t, b.jobs.Pool.QueryRow(ctx,
		`SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1`, appName).Scan(&killed))
	require.True(t, killed)
	for stmts.count("FROM operator_sessions") == sessions {
		select {
		case <-ctx.Done():
			t.Fatal("the page did not wake up on the catch-up's signal")
		case <-time.After(5 * time.Millisecond):
		}
	}

	// A transition after it is read (the barrier: the page's passes run in order).
	_, err = b.jobs.Store.BeginAttempt(ctx, job.ID)
	require.NoError(t, err)
	s.next(t, &d)
	require.Equal(t, jobs.StatusRunning, d.Job.Status)
	require.Equal(t, 2, stmts.count("FROM job_attempts"), "the first read and the transition's; none for the catch-up")
}
