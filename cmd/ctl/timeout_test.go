package main

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/jobs"
	"github.com/llmq/llmq/internal/pgtest"
	"github.com/llmq/llmq/internal/redistest"
)

// TestCtl_SilentPostgresIsBounded: a command whose Postgres stops answering after ctl connected
// (a partition, a failover behind a moved address: the connection stays open and silent) fails
// at --timeout with one line saying Postgres did not answer, and exit 1. It waited as long as the
// operator did.
func TestCtl_SilentPostgresIsBounded(t *testing.T) {
	t.Parallel()
	const deadline, cutEnds = 20 * time.Second, 8 * time.Second
	for name, tc := range map[string]struct {
		statement string // what falls silent
		args      []string
		want      string // the store's step named in the message
	}{
		"DeadList":        {"ORDER BY finished_at DESC, id DESC LIMIT", []string{"dead", "list"}, "page dead jobs"},
		"DeadRetry":       {"WITH old AS (", []string{"dead", "retry", "--all"}, "retry dead jobs"},
		"OperatorsCreate": {"INSERT INTO operators", []string{"operators", "create", "alice"}, "operator"},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := setupJobs(t)
			if name == "DeadRetry" {
				b.deadJob(t, "default", jobs.ReasonRetriesExhausted, 1)
			}
			queue := redistest.Queue(t, redistest.URL())
			proxy, proxied := pgtest.NewProxy(t, b.url)
			silenced := proxy.SilenceStatement(tc.statement)
			ctx, cancel := context.WithTimeout(t.Context(), deadline)
			defer cancel()
			done := make(chan result, 1)
			go func() {
				r, _ := runTimeout(deadline, append([]string{"--database-url", proxied, "--redis-url", redistest.URL(),
					"--queue", queue, "--timeout", "1s"}, tc.args...)...)
				done <- r
			}()
			require.True(t, silenced(ctx), "the statement was not sent")
			// Well before pgx's drain of the cut connection (15 s), which the pool's close waited
			// for: the command ended 16 s after the statement, 15 s after its message.
			ended := time.NewTimer(cutEnds)
			defer ended.Stop()
			var r result
			select {
			case r = <-done:
			case <-ended.C:
				t.Fatalf("ctl %v still waits on a silent Postgres %s after the statement", tc.args, cutEnds)
			}
			requireOneLineError(t, r, 1, "postgres did not answer within 1s, --timeout")
			require.Contains(t, r.errOut, tc.want)
		})
	}
}
