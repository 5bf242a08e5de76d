package leader_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/leader"
	"github.com/llmq/llmq/internal/pgtest"
)

const key int64 = 0x6c6c6d7174657374 // "llmqtest"

// within fails the test unless ch yields within 10 s.
func within[T any](t *testing.T, ch <-chan T) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(10 * time.Second):
		t.Fatal("timed out")
		panic("unreachable")
	}
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
		tag, err := pool.Exec(t.Context(), `SELECT pg_terminate_backend(pid) FROM pg_locks
WHERE locktype = 'advisory' AND granted AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
	AND ((classid::bigint << 32) | objid::bigint) = $1`, key)
		require.NoError(t, err)
		require.EqualValues(t, 1, tag.RowsAffected())
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
		leader.Run(ctx, pool, key, 10*time.Millisecond, func(context.Context) error { return errors.New("duty failed") },
			func(err error) {
				select {
				case reports <- err:
				default:
				}
			})
	}()

	// A duty that fails gives the lock up; the next try, an interval later, leads again.
	require.EqualError(t, within(t, reports), "duty failed")
	require.EqualError(t, within(t, reports), "duty failed")
	cancel()
	within(t, done)
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

	deadline := time.Now().Add(10 * time.Second)
	for {
		led, err := leader.Lead(t.Context(), other, key, check, func(context.Context) error { return nil })
		require.NoError(t, err)
		if led {
			return
		}
		require.True(t, time.Now().Before(deadline), "no other process could lead 10 s after the leader fell silent")
		time.Sleep(check)
	}
}
