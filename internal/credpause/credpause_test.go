package credpause_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/clocktest"
	"github.com/llmq/llmq/internal/credpause"
	"github.com/llmq/llmq/internal/limiter"
	"github.com/llmq/llmq/internal/pgtest"
	"github.com/llmq/llmq/internal/redistest"
)

var t0 = time.Date(2030, 1, 1, 12, 0, 0, 0, time.UTC)

type testBundle struct {
	store  *credpause.Store
	gate   *limiter.Gate
	prefix string
	// lose removes every key of the test's Redis namespace, as a restart without persistence or
	// a FLUSHALL would.
	lose func()
}

func setup(t *testing.T) *testBundle {
	t.Helper()
	clock := clocktest.New(t0)
	b := &testBundle{prefix: redistest.Prefix(t)}
	lim, err := limiter.New(redistest.Client(t), &limiter.Config{Prefix: b.prefix, Now: clock.Now})
	require.NoError(t, err)
	b.store = credpause.NewStore(pgtest.Pool(t), clock.Now)
	b.gate = lim.Gate("sk-capped", "main")
	b.lose = func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		redistest.Unlink(ctx, redistest.Client(t), b.prefix+"*")
	}
	return b
}

// TestStore_PauseSurvivesRedisLosingIt: a pause is kept in Postgres beside Redis; Restore writes
// it back into a Redis that lost it, the same episode, and a spend cap answered after the loss
// does not start a second episode (no second alert). Resume clears both, after which a loss
// restores "not paused".
func TestStore_PauseSurvivesRedisLosingIt(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := t.Context()

	// Concurrent spend-cap answers: exactly one caller starts the episode.
	var starts atomic.Int64
	var wg sync.WaitGroup
	for i := range 20 {
		wg.Go(func() {
			started, err := b.store.Pause(ctx, b.gate, "rate_limited_no_retry_after", "job-"+string(rune('a'+i)))
			if err != nil {
				t.Error(err)
			}
			if started {
				starts.Add(1)
			}
		})
	}
	wg.Wait()
	require.EqualValues(t, 1, starts.Load(), "exactly one caller starts the episode")
	kept, err := b.gate.Paused(ctx)
	require.NoError(t, err)
	require.True(t, kept.Paused)
	inPG, err := b.store.Get(ctx, b.gate)
	require.NoError(t, err)
	require.Equal(t, kept.FirstJobID, inPG.FirstJobID)
	require.True(t, t0.Equal(inPG.Since))

	// Redis loses it: Restore brings back the episode.
	b.lose()
	st, err := b.gate.Paused(ctx)
	require.NoError(t, err)
	require.Equal(t, limiter.PauseState{Unknown: true}, st)
	ps, restored, err := b.store.Restore(ctx, b.gate)
	require.NoError(t, err)
	require.True(t, restored)
	require.True(t, ps.Paused)
	st, err = b.gate.Paused(ctx)
	require.NoError(t, err)
	require.True(t, st.Paused)
	require.Equal(t, kept.FirstJobID, st.FirstJobID)
	require.True(t, t0.Equal(st.Since))
	_, restored, err = b.store.Restore(ctx, b.gate)
	require.NoError(t, err)
	require.False(t, restored, "Redis holds the state: nothing to restore")

	// Lost again and answered by a spend cap before any restore: the episode goes on, unannounced.
	b.lose()
	started, err := b.store.Pause(ctx, b.gate, "rate_limited_no_retry_after", "job-after-the-loss")
	require.NoError(t, err)
	require.False(t, started, "the episode Postgres keeps goes on: no second alert")
	st, err = b.gate.Paused(ctx)
	require.NoError(t, err)
	require.True(t, st.Paused)

	// Resume ends it in both; a later loss restores "not paused".
	was, err := b.store.Resume(ctx, b.gate)
	require.NoError(t, err)
	require.True(t, was)
	inPG, err = b.store.Get(ctx, b.gate)
	require.NoError(t, err)
	require.Equal(t, limiter.PauseState{}, inPG)
	b.lose()
	ps, restored, err = b.store.Restore(ctx, b.gate)
	require.NoError(t, err)
	require.True(t, restored)
	require.False(t, ps.Paused)
	st, err = b.gate.Paused(ctx)
	require.NoError(t, err)
	require.Equal(t, limiter.PauseState{}, st)
	was, err = b.store.Resume(ctx, b.gate)
	require.NoError(t, err)
	require.False(t, was)

	// The next spend cap is a new episode.
	started, err = b.store.Pause(ctx, b.gate, "rate_limited_no_retry_after", "job-next")
	require.NoError(t, err)
	require.True(t, started)
}

// TestStore_ResumeWinsOverARestoreReadBeforeIt: a Restore that read the pause from Postgres
// before a Resume, and writes it after, does not bring the pause back.
func TestStore_ResumeWinsOverARestoreReadBeforeIt(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := t.Context()
	_, err := b.store.Pause(ctx, b.gate, "rate_limited_no_retry_after", "job-1")
	require.NoError(t, err)
	b.lose()
	stale, err := b.store.Get(ctx, b.gate) // the Restore's read
	require.NoError(t, err)
	require.True(t, stale.Paused)
	_, err = b.store.Resume(ctx, b.gate)
	require.NoError(t, err)
	restored, err := b.gate.RestorePause(ctx, stale) // the Restore's write
	require.NoError(t, err)
	require.False(t, restored)
	st, err := b.gate.Paused(ctx)
	require.NoError(t, err)
	require.Equal(t, limiter.PauseState{}, st)
}
