package leader_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/leader"
	"github.com/llmq/llmq/internal/logstreak"
	"github.com/llmq/llmq/internal/logtest"
	"github.com/llmq/llmq/internal/pgtest"
)

const key int64 = 0x6c6c6d7174657374 // "llmqtest"

// within fails the test unless ch yields within 10 s.
func within[T any](t *testing.T, ch <-chan T) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(30 * time.Second):
		t.Fatal("timed out")
		panic("unreachable")
	}
}

// terminateLockHolder ends the Postgres session that holds the leader lock of the test's database.
func terminateLockHolder(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	tag, err := pool.Exec(t.Context(), `SELECT pg_terminate_backend(pid) FROM pg_locks
WHERE locktype = 'advisory' AND granted AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
	AND ((classid::bigint << 32) | objid::bigint) = $1`, key)
	require.NoError(t, err)
	require.EqualValues(t, 1, tag.RowsAffected())
}

type result struct {
	led bool
	err error
}

// leadInBackground runs Lead with an fn that reports its start on started and runs until its
// context ends or release is closed; Lead's answer comes on the returned channel.
func leadInBackground(ctx context.Context, t *testing.T, lead func(context.Context, func(context.Context) error) (bool, error),
	release <-chan struct{}) (started <-chan context.Context, done <-chan result) {
	t.Helper()
	s, d, finished := make(chan context.Context, 1), make(chan result, 1), make(chan struct{})
	go func() {
		defer close(finished)
		led, err := lead(ctx, func(ctx context.Context) error {
			s <- ctx
			select {
			case <-ctx.Done():
			case <-release:
			}
			return nil
		})
		d <- result{led, err}
	}()
	t.Cleanup(func() { within(t, finished) })
	return s, d
}

func TestLead(t *testing.T) {
	t.Parallel()

	t.Run("OneLeaderAtATime", func(t *testing.T) {
		t.Parallel()
		pool := pgtest.Pool(t)
		lead := func(ctx context.Context, fn func(context.Context) error) (bool, error) {
			return leader.Lead(ctx, pool, key, time.Minute, fn)
		}
		release := make(chan struct{})
		started, done := leadInBackground(t.Context(), t, lead, release)
		within(t, started)

		// Given a leader, another try returns at once without running its duty.
		led, err := lead(t.Context(), func(context.Context) error {
			t.Error("a second leader ran")
			return nil
		})
		require.NoError(t, err)
		require.False(t, led)

		// Once the leader's duty returns, the lock is free for the next.
		close(release)
		require.Equal(t, result{led: true}, within(t, done))
		ran := false
		led, err = lead(t.Context(), func(context.Context) error {
			ran = true
			return errors.New("duty failed")
		})
		require.True(t, led)
		require.True(t, ran)
		require.EqualError(t, err, "duty failed")
	})

	t.Run("LostConnectionEndsTheDuty", func(t *testing.T) {
		t.Parallel()
		pool := pgtest.Pool(t)
		started, done := leadInBackground(t.Context(), t, func(ctx context.Context, fn func(context.Context) error) (bool, error) {
			return leader.Lead(ctx, pool, key, 20*time.Millisecond, fn)
		}, nil)
		duty := within(t, started)

		// When the lock's session is killed (a Postgres restart, a network cut), the duty's
		// context ends: another process may lead by now.
		terminateLockHolder(t, pool)
		within(t, duty.Done())
		r := within(t, done)
		require.True(t, r.led)
		require.ErrorContains(t, r.err, "leader lock connection")
	})

	t.Run("EndedSessionEndsTheDutyBeforeTheNextCheck", func(t *testing.T) {
		t.Parallel()
		pool := pgtest.Pool(t)
		lead := func(ctx context.Context, fn func(context.Context) error) (bool, error) {
			return leader.Lead(ctx, pool, key, time.Hour, fn)
		}
		started, done := leadInBackground(t.Context(), t, lead, nil)
		duty := within(t, started)

		// When Postgres ends the lock's session (pg_terminate_backend, a restart, a failover), the
		// lock is free at once and another process may take it on its next try: the duty ends
		// then too, not at its next check (an hour on here), so that two never lead side by side.
		terminateLockHolder(t, pool)
		within(t, duty.Done())
		r := within(t, done)
		require.True(t, r.led)
		require.ErrorContains(t, r.err, "leader lock connection")
	})

	t.Run("CanceledContextEndsTheDutyAndFreesTheLock", func(t *testing.T) {
		t.Parallel()
		pool := pgtest.Pool(t)
		ctx, cancel := context.WithCancel(t.Context())
		lead := func(ctx context.Context, fn func(context.Context) error) (bool, error) {
			return leader.Lead(ctx, pool, key, time.Minute, fn)
		}
		started, done := leadInBackground(ctx, t, lead, nil)
		within(t, started)
		cancel()
		require.Equal(t, result{led: true}, within(t, done))
		led, err := lead(t.Context(), func(context.Context) error { return nil })
		require.NoError(t, err)
		require.True(t, led)
	})
}

func TestRun(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	ctx, cancel := context.WithCancel(t.Context())
	reports := make(chan error, 10)
	done := make(chan struct{})
	go func() {
		defer close(done)
		leader.Run(ctx, pool, key, 10*time.Millisecond, nil, func(context.Context) error { return errors.New("duty failed") },
			func(err error) {
				select {
				case reports <- err:
				default:
				}
			})
	}()

	// A duty that fails gives the lock up; the next try, an interval later, leads again. Each
	// lead is told as it begins (nil) and as it ends.
	for range 2 {
		require.NoError(t, within(t, reports))
		require.EqualError(t, within(t, reports), "duty failed")
	}
	cancel()
	within(t, done)
}

// llmq_leader is 0 until the duty leads here, 1 from the start of the lead, and 0 again once
// the lead is lost (its lock session ended by Postgres) and once ctx ends it.
func TestRun_LeaderGauge(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	gauge := leader.NewMetrics(prometheus.NewRegistry()).Duty("test")
	require.Zero(t, testutil.ToFloat64(gauge))
	type seen struct {
		err   error
		value float64 // the gauge as the report came
	}
	reports := make(chan seen, 10)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() {
		defer close(done)
		leader.Run(ctx, pool, key, 200*time.Millisecond, gauge, func(ctx context.Context) error {
			<-ctx.Done()
			return nil
		}, func(err error) {
			select {
			case reports <- seen{err, testutil.ToFloat64(gauge)}:
			default:
			}
		})
	}()
	t.Cleanup(func() { cancel(); within(t, done) })

	r := within(t, reports) // it begins to lead
	require.NoError(t, r.err)
	require.Equal(t, 1.0, r.value)
	terminateLockHolder(t, pool)
	r = within(t, reports) // the lead is lost
	require.ErrorContains(t, r.err, "leader lock connection")
	require.Zero(t, r.value)
	// And taken again at a later try. Postgres sends the ended session's error before that
	// session lets go of the lock, so a try in between finds the lock held (nil, not leading).
	again := time.After(30 * time.Second)
	for r.value != 1 {
		select {
		case r = <-reports:
			require.NoError(t, r.err)
		case <-again:
			t.Fatal("not leading again within 30 s")
		}
	}
	cancel()
	within(t, done)
	require.Zero(t, testutil.ToFloat64(gauge))
}

// A leader whose lock connection falls silent (its host lost without closing the socket, a
// partition) does not keep the lock until TCP's keepalive gives up, hours later: Postgres ends
// the idle session after three checks, and another process leads.
func TestLead_SilentLeaderLosesTheLock(t *testing.T) {
	t.Parallel()
	const check = 200 * time.Millisecond
	dbURL := pgtest.URL(t)
	proxy, viaProxy := pgtest.NewProxy(t, dbURL)
	silent, err := pgxpool.New(t.Context(), viaProxy)
	require.NoError(t, err)
	t.Cleanup(silent.Close)
	other, err := pgxpool.New(t.Context(), dbURL)
	require.NoError(t, err)
	t.Cleanup(other.Close)

	ctx, cancel := context.WithCancel(t.Context())
	t.Cleanup(cancel)
	started, _ := leadInBackground(ctx, t, func(ctx context.Context, fn func(context.Context) error) (bool, error) {
		return leader.Lead(ctx, silent, key, check, fn)
	}, nil)
	within(t, started)
	hold := proxy.HoldStatement("-- ping") // its checks reach Postgres no more
	t.Cleanup(hold.Release)
	within(t, hold.Reached())

	deadline := time.Now().Add(30 * time.Second)
	for {
		led, err := leader.Lead(t.Context(), other, key, check, func(context.Context) error { return nil })
		require.NoError(t, err)
		if led {
			return
		}
		require.True(t, time.Now().Before(deadline), "no other process could lead 30 s after the leader fell silent")
		time.Sleep(check)
	}
}

// The leader bounds its lock session's idleness while it leads; the connection goes back to the
// pool with the operator's setting (the connection string's, or the database's or role's), not
// without any bound.
func TestLead_GivesTheConnectionBackWithItsIdleTimeout(t *testing.T) {
	t.Parallel()
	for name, set := range map[string]func(t *testing.T, cfg *pgxpool.Config){
		"ConnectionString": func(t *testing.T, cfg *pgxpool.Config) {
			cfg.ConnConfig.RuntimeParams["idle_session_timeout"] = "1h"
		},
		"Database": func(t *testing.T, cfg *pgxpool.Config) {
			conn, err := pgx.ConnectConfig(t.Context(), cfg.ConnConfig)
			require.NoError(t, err)
			defer conn.Close(t.Context())
			_, err = conn.Exec(t.Context(), "ALTER DATABASE "+pgx.Identifier{cfg.ConnConfig.Database}.Sanitize()+
				" SET idle_session_timeout = '1h'") // the test's database, dropped with it
			require.NoError(t, err)
		},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			cfg, err := pgxpool.ParseConfig(pgtest.URL(t))
			require.NoError(t, err)
			set(t, cfg)
			cfg.MaxConns = 1 // Lead's connection is the one read after it
			pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
			require.NoError(t, err)
			t.Cleanup(pool.Close)

			led, err := leader.Lead(t.Context(), pool, key, time.Minute, func(ctx context.Context) error { return nil })
			require.NoError(t, err)
			require.True(t, led)
			var idle string
			require.NoError(t, pool.QueryRow(t.Context(), "SHOW idle_session_timeout").Scan(&idle))
			require.Equal(t, "1h", idle)
		})
	}
}

// Run with a logstreak report logs the first failed try of a Postgres outage only; once it leads
// again the run of errors is over, so that the loss of the lock hours later is logged too.
func TestRun_LogStreakEndsWhenItLeads(t *testing.T) {
	t.Parallel()
	proxy, viaProxy := pgtest.NewProxy(t, pgtest.URL(t))
	pool, err := pgxpool.New(t.Context(), viaProxy)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	var logs logtest.Buffer
	ctx, cancel := context.WithCancel(t.Context())
	report := logstreak.New(ctx, slog.New(slog.NewTextHandler(&logs, nil)), "duty")
	leading := make(chan struct{}, 10)
	done := make(chan struct{})
	proxy.Cut()
	go func() {
		defer close(done)
		// 100 ms between tries, and as the lock connection's ping bound: a ping slower than that
		// on a loaded machine would lose the lead, and log, before the test cuts it.
		leader.Run(ctx, pool, key, 100*time.Millisecond, nil, func(ctx context.Context) error {
			leading <- struct{}{}
			<-ctx.Done()
			return nil
		}, report)
	}()
	t.Cleanup(func() { cancel(); within(t, done) })

	deadline := time.Now().Add(30 * time.Second)
	for proxy.Refused() < 3 { // three failed tries: one line
		require.True(t, time.Now().Before(deadline), "Run did not try three times in 30 s")
		time.Sleep(10 * time.Millisecond)
	}
	proxy.Restore()
	within(t, leading)
	refused := proxy.Refused()
	proxy.Cut() // the lock's connection is reset: the lead is lost, and the next try refused
	deadline = time.Now().Add(30 * time.Second)
	for proxy.Refused() == refused {
		require.True(t, time.Now().Before(deadline), "Run did not try again in 30 s")
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	within(t, done)
	out := logs.String()
	require.Equal(t, 2, strings.Count(out, "level=WARN"), out)
	require.Contains(t, out, "leader lock connection", out)
}

// Between its checks the leader waits on its lock session's socket with a deadline: the deadlines
// that pass, the pings after them, and notifications for a LISTEN some other code left on the
// pooled connection neither end the duty nor spoil the connection, which goes back to the pool
// open and usable (not closed and replaced).
func TestLead_ChecksLeaveTheConnectionUsable(t *testing.T) {
	t.Parallel()
	const check = 500 * time.Millisecond // a ping answers well within it on a loaded machine
	dbURL := pgtest.URL(t)
	cfg, err := pgxpool.ParseConfig(dbURL)
	require.NoError(t, err)
	cfg.MaxConns = 1 // Lead's connection is the one read before and after it
	pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	other, err := pgxpool.New(t.Context(), dbURL)
	require.NoError(t, err)
	t.Cleanup(other.Close)

	var pid uint32
	_, err = pool.Exec(t.Context(), "LISTEN llmq_leader_test")
	require.NoError(t, err)
	require.NoError(t, pool.QueryRow(t.Context(), "SELECT pg_backend_pid()").Scan(&pid))
	led, err := leader.Lead(t.Context(), pool, key, check, func(ctx context.Context) error {
		// Three checks (a deadline passed, then a ping), seen from another session as new
		// starts of the lock session's "-- ping", with notifications between them.
		var pings []time.Time
		deadline := time.Now().Add(30 * time.Second)
		for len(pings) < 3 {
			if time.Now().After(deadline) {
				return errors.New("three checks did not run within 30 s")
			}
			var query string
			var start time.Time
			if err := other.QueryRow(t.Context(), "SELECT query, query_start FROM pg_stat_activity WHERE pid = $1",
				int32(pid)).Scan(&query, &start); err != nil {
				return err
			}
			if query == "-- ping" && (len(pings) == 0 || start.After(pings[len(pings)-1])) {
				pings = append(pings, start)
				if _, err := other.Exec(t.Context(), "NOTIFY llmq_leader_test, 'not for the leader'"); err != nil {
					return err
				}
			}
			time.Sleep(10 * time.Millisecond)
		}
		return context.Cause(ctx) // nil: the checks and notifications did not end the duty
	})
	require.NoError(t, err)
	require.True(t, led)

	conn, err := pool.Acquire(t.Context())
	require.NoError(t, err)
	defer conn.Release()
	require.Equal(t, pid, conn.Conn().PgConn().PID(), "the lock's connection went back to the pool")
	var one int
	require.NoError(t, conn.QueryRow(t.Context(), "SELECT 1").Scan(&one))
	require.Equal(t, 1, one)
	var locks int
	require.NoError(t, conn.QueryRow(t.Context(), "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = $1",
		int32(pid)).Scan(&locks))
	require.Zero(t, locks, "the lock was released")
}

// A try whose lock statement gets no answer (the server stopped answering on that connection:
// hung, or partitioned after the handshake) ends within its bound (5 s) with an error, and
// Run tries again on its next tick, instead of the try waiting for ever while no process leads.
func TestLead_SilentTryEndsWithinItsBound(t *testing.T) {
	t.Parallel()
	const check = 200 * time.Millisecond
	proxy, viaProxy := pgtest.NewProxy(t, pgtest.URL(t))
	pool, err := pgxpool.New(t.Context(), viaProxy)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	hold := proxy.HoldStatement("pg_try_advisory_lock")
	t.Cleanup(hold.Release)

	done := make(chan result, 1)
	go func() {
		led, err := leader.Lead(t.Context(), pool, key, check, func(context.Context) error { return nil })
		done <- result{led, err}
	}()
	within(t, hold.Reached())
	r := within(t, done)
	require.False(t, r.led)
	require.ErrorContains(t, r.err, "take leader lock")
}
