package main

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/jobs"
	"github.com/llmq/llmq/internal/operator"
	"github.com/llmq/llmq/internal/pgtest"
	"github.com/llmq/llmq/internal/redistest"
	"github.com/llmq/llmq/migrations"
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
		"DeadList":        {"ORDER BY jobs.finished_at DESC, jobs.id DESC LIMIT", []string{"dead", "list"}, "page dead jobs"},
		"DeadRetry":       {"WITH old AS (", []string{"dead", "retry", "--all"}, "retry dead jobs"},
		"OperatorsCreate": {"INSERT INTO operators", []string{"operators", "create", "alice"}, "operator"},
		// A cut COMMIT may have landed: the message says so, and how to check, as the
		// decision does ("A statement cut by --timeout ... may still commit").
		"OperatorsRevokeCommit": {"commit", []string{"operators", "revoke", "bob"},
			"to a COMMIT: what it changed may have been applied; check with a list or show command (ctl operators list)"},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := setupJobs(t)
			switch name {
			case "DeadRetry":
				b.deadJob(t, "default", jobs.ReasonRetriesExhausted, 1)
			case "OperatorsRevokeCommit":
				_, _, err := operator.NewStore(b.pool, nil).Create(t.Context(), "bob")
				require.NoError(t, err)
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

// TestStatementBound_BoundsTheWaitForAConnection: --timeout bounds the wait for a connection of
// the pool too, not only the statements: pgxpool pings a connection idle for over a second
// before handing it out, with the caller's context, and a Postgres fallen silent meanwhile (a
// partition) never answers that ping; no statement had begun, so nothing bounded it, and ctl
// hung (here, a command that waits: revoke --cancel-jobs's settle, a delete's).
func TestStatementBound_BoundsTheWaitForAConnection(t *testing.T) {
	t.Parallel()
	b := setupJobs(t)
	proxy, proxied := pgtest.NewProxy(t, b.url)
	bound := &statementBound{wait: time.Second}
	p, err := newPool(t.Context(), proxied, bound)
	require.NoError(t, err)
	_, err = p.Exec(t.Context(), "SELECT 1")
	require.NoError(t, err)
	// pgxpool's own threshold (its default ShouldPing): a connection idle over 1 s is pinged.
	time.Sleep(1100 * time.Millisecond)
	proxy.Freeze()

	done := make(chan error, 1)
	go func() {
		_, err := p.Exec(context.Background(), "SELECT 1")
		p.Close()
		done <- err
	}()
	ended := time.NewTimer(30 * time.Second)
	defer ended.Stop()
	select {
	case err = <-done:
	case <-ended.C:
		t.Fatal("the wait for a connection of a silent Postgres is not bounded by --timeout")
	}
	require.Error(t, err)
	require.True(t, bound.timedOut.Load(), "the bound that fired is recorded, for run's message")
}

// TestStatementBound_APingAnsweredPastTheBoundLeavesNoClosedConnection: an acquire whose bound
// fires while the ping of its connection is on its way, the ping's answer coming back before ctl
// acts on the bound, leaves the pool no connection ctl closed. pgxpool's ping went on past the
// deadline and, answered, gave the connection back to the pool, which ctl then closed (as a
// connection cut while pinging): the next statement, handed it without a ping (idle under a
// second), failed. The interleaving is forced: the ping is held at the proxy while the bound
// fires (its context canceled with the bound's cause, no deadline, so that the ping itself is not
// cut), and TraceAcquireEnd waits until the acquire no longer holds the connection.
func TestStatementBound_APingAnsweredPastTheBoundLeavesNoClosedConnection(t *testing.T) {
	t.Parallel()
	b := setupJobs(t)
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	proxy, proxied := pgtest.NewProxy(t, b.url)
	bound := &statementBound{wait: time.Minute}
	cfg, err := migrations.ParseConfig(proxied)
	require.NoError(t, err)
	cfg.MaxConns = 1
	bound.configure(cfg)
	// pgxpool's rule pings a connection idle over a second: this one is, for the racing acquire,
	// without a second's wait.
	var idle atomic.Bool
	should := cfg.ShouldPing
	cfg.ShouldPing = func(ctx context.Context, p pgxpool.ShouldPingParams) bool {
		if idle.Load() {
			p.IdleDuration = time.Hour
		}
		return should(ctx, p)
	}
	cfg.ConnConfig.Tracer = &lateAcquireEnd{statementBound: bound, t: t}
	p, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	defer p.Close()
	_, err = p.Exec(ctx, "SELECT 1")
	require.NoError(t, err)

	ping := proxy.HoldStatement("-- ping")
	defer ping.Release()
	acquire, fire := context.WithCancelCause(ctx)
	defer fire(nil)
	idle.Store(true)
	done := make(chan error, 1)
	go func() {
		_, err := p.Exec(acquire, "SELECT 1")
		done <- err
	}()
	select {
	case <-ping.Reached():
	case <-ctx.Done():
		t.Fatal("the idle connection was not pinged")
	}
	fire(errStatementTimeout)
	ping.Release()
	select {
	case err = <-done:
	case <-ctx.Done():
		t.Fatal("the acquire did not end at its bound")
	}
	require.Error(t, err)
	require.True(t, bound.timedOut.Load(), "the bound that fired is recorded")
	idle.Store(false)

	// The next statement, on the pool's connection (idle under a second: not pinged).
	_, err = p.Exec(ctx, "SELECT 1")
	require.NoError(t, err, "the pool handed out a connection ctl had closed")
}

// lateAcquireEnd is a statementBound whose failed acquires' TraceAcquireEnd waits until the
// acquire's connection is no longer held by it (given back to the pool or destroyed).
type lateAcquireEnd struct {
	*statementBound
	t *testing.T
}

func (l *lateAcquireEnd) TraceAcquireEnd(ctx context.Context, p *pgxpool.Pool, d pgxpool.TraceAcquireEndData) {
	if d.Err != nil {
		deadline := time.Now().Add(10 * time.Second)
		for p.Stat().AcquiredConns() > 0 {
			if time.Now().After(deadline) {
				l.t.Error("the acquire's connection is still held 10 s after its bound")
				break
			}
			time.Sleep(time.Millisecond)
		}
	}
	l.statementBound.TraceAcquireEnd(ctx, p, d)
}

// TestStatementBound_AnUnsentStatementOnAClosingConnectionIsClosedAtOnce: a statement the bound
// cut whose error says nothing was sent (pgconn.SafeToRetry) leaves its connection alone only
// when pgx left it open. pgx also answers SafeToRetry for a message it failed to write at all
// (here: one it could not encode) and closes that connection in the background, reading what is
// left on it for up to 15 s first, which a silent server never ends and the pool's close waits
// for: end took SafeToRetry for "the connection is as it was" and left it so, and the command
// ended 15 s after its message. The bound's cut is forced (its cause set) on that error, which
// pgx v5.13 gives for an unencodable message rather than for a cut.
func TestStatementBound_AnUnsentStatementOnAClosingConnectionIsClosedAtOnce(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	proxy, proxied := pgtest.NewProxy(t, pgtest.URL(t))
	cfg, err := migrations.ParseConfig(proxied)
	require.NoError(t, err)
	conn, err := pgx.ConnectConfig(ctx, cfg.ConnConfig)
	require.NoError(t, err)
	defer conn.Close(context.Background())
	proxy.Freeze() // Postgres silent: pgx's close would wait its 15 s

	// More parameter types than the protocol carries: pgx writes nothing, and closes.
	_, err = conn.PgConn().Prepare(ctx, "s", "SELECT 1", make([]uint32, 1<<16))
	require.Error(t, err)
	require.True(t, pgconn.SafeToRetry(err), "nothing was sent: %v", err)
	require.True(t, conn.IsClosed(), "pgx is closing the connection")

	cut, fire := context.WithCancelCause(ctx)
	fire(errStatementTimeout)
	bound := &statementBound{wait: time.Second}
	// Taken for a COMMIT: one never written cannot have been applied.
	bound.end(context.WithValue(cut, boundSQL{}, "commit"), conn, err)
	require.True(t, bound.timedOut.Load())
	require.False(t, bound.commitUncertain(), "a COMMIT never sent is no uncertain one")

	closed := time.NewTimer(5 * time.Second)
	defer closed.Stop()
	select {
	case <-conn.PgConn().CleanupDone():
	case <-closed.C:
		t.Fatal("the connection pgx is closing is still open 5 s after the cut (its drain of a silent server lasts 15 s)")
	}
}

// TestStatementBound_AStatementNeverSentKeepsItsConnection: a statement whose bound had fired
// before pgx sent it (SafeToRetry, the connection left open) keeps its connection, for the
// command's next statement.
func TestStatementBound_AStatementNeverSentKeepsItsConnection(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, pgtest.URL(t))
	require.NoError(t, err)
	defer conn.Close(context.Background())

	cut, fire := context.WithCancelCause(ctx)
	fire(errStatementTimeout)
	_, err = conn.Exec(cut, "SELECT 1")
	require.Error(t, err)
	require.True(t, pgconn.SafeToRetry(err), "never sent: %v", err)
	bound := &statementBound{wait: time.Second}
	bound.end(cut, conn, err)
	require.True(t, bound.timedOut.Load())
	_, err = conn.Exec(ctx, "SELECT 1")
	require.NoError(t, err, "the connection was closed")
}
