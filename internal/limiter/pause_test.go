package limiter_test

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/limiter"
)

func TestCredential_Pause(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	id := "sk-spend-cap"
	creds := []*limiter.Gate{b.lim.Gate(id, "main"), b.lim2.Gate(id, "main")}
	ctx := t.Context()

	// concurrently runs f from 50 callers over both clients and counts the trues.
	concurrently := func(f func(c *limiter.Gate, i int) (bool, error)) int {
		var n atomic.Int64
		var wg sync.WaitGroup
		for i := range 50 {
			wg.Go(func() {
				ok, err := f(creds[i%2], i)
				if err != nil {
					t.Error(err)
				}
				if ok {
					n.Add(1)
				}
			})
		}
		wg.Wait()
		return int(n.Load())
	}

	st, err := creds[0].Paused(ctx)
	require.NoError(t, err)
	require.Equal(t, limiter.PauseState{}, st)

	var starter atomic.Value
	require.Equal(t, 1, concurrently(func(c *limiter.Gate, i int) (bool, error) {
		job := "job-" + string(rune('A'+i%26)) + string(rune('a'+i/26))
		started, err := c.Pause(ctx, "rate_limited_no_retry_after", job)
		if started {
			starter.Store(job)
		}
		return started, err
	}), "exactly one caller starts the episode")
	st, err = creds[1].Paused(ctx)
	require.NoError(t, err)
	require.True(t, st.Paused)
	require.True(t, t0.Equal(st.Since))
	require.Equal(t, "rate_limited_no_retry_after", st.Reason)
	require.Equal(t, starter.Load(), st.FirstJobID)
	require.Equal(t, 1.0, b.metric(t, "llmq_limiter_paused", "main"))

	// Automatic probes: none before one interval, then one per interval.
	every := 30 * time.Second
	probe := func(c *limiter.Gate, _ int) (bool, error) { return c.TryProbe(ctx, every) }
	require.Equal(t, 0, concurrently(probe))
	b.clock.Advance(every)
	require.Equal(t, 1, concurrently(probe))
	b.clock.Advance(every - time.Millisecond)
	require.Equal(t, 0, concurrently(probe))
	b.clock.Advance(time.Millisecond)
	require.Equal(t, 1, concurrently(probe))

	// A pause does not expire by itself.
	b.clock.Advance(24 * time.Hour)
	st, err = creds[0].Paused(ctx)
	require.NoError(t, err)
	require.True(t, st.Paused)

	was, err := creds[1].Resume(ctx)
	require.NoError(t, err)
	require.True(t, was)
	st, err = creds[0].Paused(ctx)
	require.NoError(t, err)
	require.False(t, st.Paused)
	require.Equal(t, 0.0, b.metric(t, "llmq_limiter_paused", "main"))
	require.Equal(t, 0, concurrently(probe), "no probes when not paused")
	was, err = creds[1].Resume(ctx)
	require.NoError(t, err)
	require.False(t, was)

	// The next spend cap is a new episode.
	started, err := creds[0].Pause(ctx, "rate_limited_no_retry_after", "job-next")
	require.NoError(t, err)
	require.True(t, started)
}
