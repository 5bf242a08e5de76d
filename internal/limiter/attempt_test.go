package limiter_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/limiter"
	"github.com/llmq/llmq/internal/tokens"
)

// budgetOfFirsts is a retry budget that allows exactly one retry per first attempt counted.
func budgetOfFirsts(c *limiter.Config) {
	c.Budget.Floor = -1
	c.Budget.Ratio = 1
}

// retriesAllowed asks c's retry budget until it refuses and returns how many it granted.
func retriesAllowed(t *testing.T, c *limiter.Gate) int {
	t.Helper()
	n := 0
	for {
		ok, err := c.AllowRetry(t.Context(), "")
		require.NoError(t, err)
		if !ok {
			return n
		}
		n++
	}
}

func TestCredential_ReserveAttempt(t *testing.T) {
	t.Parallel()
	both := limiter.AttemptOptions{UnlessPaused: true, FirstAttempt: true}

	t.Run("PausedRefusesAndTakesNothing", func(t *testing.T) {
		t.Parallel()
		b := setup(t, budgetOfFirsts)
		c := b.lim.Gate("sk-paused", "main")
		ctx := t.Context()
		lim := limiter.Limit{Rate: 1, Burst: 1}
		_, err := c.Pause(ctx, "rate_limited_no_retry_after", "job-1")
		require.NoError(t, err)

		r, err := c.ReserveAttempt(ctx, lim, tokens.Cost{}, both)
		require.NoError(t, err)
		require.False(t, r.Granted)
		require.True(t, r.Paused.Paused)
		require.True(t, t0.Equal(r.Paused.Since))
		require.Equal(t, "rate_limited_no_retry_after", r.Paused.Reason)
		require.Equal(t, "job-1", r.Paused.FirstJobID)
		require.Zero(t, r.Seq)
		require.Equal(t, 1.0, b.metric(t, "llmq_limiter_paused", "main"))
		// AcquireAttempt hands the refusal back at once instead of asking again.
		r, err = c.AcquireAttempt(ctx, lim, tokens.Cost{}, time.Hour, both)
		require.NoError(t, err)
		require.True(t, r.Paused.Paused)
		require.Zero(t, retriesAllowed(t, c), "a refused ask counts no first attempt")

		// The pause's probe asks without the check and gets the slot.
		r, err = c.ReserveAttempt(ctx, lim, tokens.Cost{}, limiter.AttemptOptions{FirstAttempt: true})
		require.NoError(t, err)
		require.True(t, r.Granted)
		require.Zero(t, r.Wait, "the refusals took no slot: the burst of one was still there")
		require.Equal(t, 1, retriesAllowed(t, c))

		_, err = c.Resume(ctx)
		require.NoError(t, err)
		b.clock.Advance(time.Second + 100*time.Millisecond) // the next slot of 1/s, margins included
		r, err = c.ReserveAttempt(ctx, lim, tokens.Cost{}, both)
		require.NoError(t, err)
		require.True(t, r.Granted)
		require.False(t, r.Paused.Paused)
		require.Equal(t, 0.0, b.metric(t, "llmq_limiter_paused", "main"))
		require.Equal(t, 1, retriesAllowed(t, c))
	})

	t.Run("FirstAttemptCountsGrantsOnly", func(t *testing.T) {
		t.Parallel()
		b := setup(t, budgetOfFirsts)
		id := "sk-firsts"
		c1, c2 := b.lim.Gate(id, "main"), b.lim2.Gate(id, "main")
		ctx := t.Context()
		// Nothing is known of the limit: one probe goes out, the others are told to ask again.
		r, err := c1.ReserveAttempt(ctx, limiter.Limit{}, tokens.Cost{}, both)
		require.NoError(t, err)
		require.True(t, r.Granted)
		require.True(t, r.Probe)
		for range 3 {
			r, err = c2.ReserveAttempt(ctx, limiter.Limit{}, tokens.Cost{}, both)
			require.NoError(t, err)
			require.False(t, r.Granted)
		}
		// Without FirstAttempt (a retry's ask) nothing is counted either.
		r, err = c2.ReserveAttempt(ctx, limiter.Limit{Rate: 100, Burst: 10}, tokens.Cost{},
			limiter.AttemptOptions{UnlessPaused: true})
		require.NoError(t, err)
		require.True(t, r.Granted)
		require.Equal(t, 1, retriesAllowed(t, c2), "one first attempt: the probe's grant")
	})
}
