package limiter_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/limiter"
	"github.com/llmq/llmq/internal/redistest"
)

// A 429 asking for more than MaxRetryAfter pushes the shared schedule back by MaxRetryAfter only:
// one header ("Retry-After: 99999999", which parses to the hour Retry-After is clamped to) must
// not stall every tenant and worker of the credential for an hour. PushBack says until when and
// why; ClearPushBack ends it, and the schedule starts again at once.
func TestCredential_PushBack(t *testing.T) {
	t.Parallel()

	t.Run("CappedAndCleared", func(t *testing.T) {
		t.Parallel()
		b := setup(t, func(c *limiter.Config) { c.MaxRetryAfter = 5 * time.Minute })
		c, other := b.lim.Gate("sk-cap", "main"), b.lim2.Gate("sk-cap", "main")
		ctx := t.Context()
		lim := limiter.Limit{Rate: 10, Burst: 20}
		pb, err := c.PushBack(ctx)
		require.NoError(t, err)
		require.Equal(t, limiter.PushBack{}, pb, "nothing pushed back yet")
		require.False(t, pb.Active())

		// Given a 429 asking for an hour
		r, err := c.Reserve(ctx, lim)
		require.NoError(t, err)
		require.NoError(t, c.Observe(ctx, limiter.Observation{At: t0, StatusCode: 429, RetryAfter: time.Hour,
			HasRetryAfter: true, Seq: r.Seq}))

		// then no process is held back longer than the cap (plus the phase margin)
		r, err = other.Reserve(ctx, lim)
		require.NoError(t, err)
		requireTime(t, t0.Add(5*time.Minute+100*time.Millisecond), r.SendAt)
		// and PushBack says until when and why.
		pb, err = other.PushBack(ctx)
		require.NoError(t, err)
		requireTime(t, t0.Add(5*time.Minute), pb.Until)
		requireTime(t, t0, pb.At)
		require.Equal(t, time.Hour, pb.RetryAfter)
		require.Equal(t, 5*time.Minute, pb.Applied)
		require.Equal(t, "Retry-After 3600s from a 429, capped at 300s", pb.Reason())

		// When an operator clears it, it is gone, and the schedule starts again from now, as at the
		// end of a push-back (the bucket holds one request, sent after the phase margin), not
		// after the slot already handed out.
		b.clock.Advance(time.Second)
		cleared, err := c.ClearPushBack(ctx)
		require.NoError(t, err)
		require.Equal(t, pb, cleared)
		pb, err = other.PushBack(ctx)
		require.NoError(t, err)
		require.False(t, pb.Active())
		r, err = other.Reserve(ctx, lim)
		require.NoError(t, err)
		requireTime(t, t0.Add(time.Second+100*time.Millisecond), r.SendAt)
		r, err = other.Reserve(ctx, lim)
		require.NoError(t, err)
		requireTime(t, t0.Add(time.Second+(100+101)*time.Millisecond), r.SendAt) // then paced
		cleared, err = c.ClearPushBack(ctx)
		require.NoError(t, err)
		require.Equal(t, limiter.PushBack{}, cleared, "clearing again finds nothing")
	})

	t.Run("ShortHintUncapped", func(t *testing.T) {
		t.Parallel()
		b := setup(t, nil)
		c := b.lim.Gate("sk-short", "main")
		require.NoError(t, c.Observe(t.Context(), limiter.Observation{At: t0, StatusCode: 429, RetryAfter: 300 * time.Second,
			HasRetryAfter: true}))
		pb, err := c.PushBack(t.Context())
		require.NoError(t, err)
		requireTime(t, t0.Add(300*time.Second), pb.Until)
		require.Equal(t, "Retry-After 300s from a 429", pb.Reason())

		// A later, shorter 429 does not shorten it, nor change why.
		b.clock.Advance(time.Second)
		require.NoError(t, c.Observe(t.Context(), limiter.Observation{At: b.clock.Now(), StatusCode: 429,
			RetryAfter: 2 * time.Second, HasRetryAfter: true}))
		again, err := c.PushBack(t.Context())
		require.NoError(t, err)
		require.Equal(t, pb, again)

		// Once it has passed, none is in force.
		b.clock.Advance(300 * time.Second)
		pb, err = c.PushBack(t.Context())
		require.NoError(t, err)
		require.False(t, pb.Active())
	})

	t.Run("MaxRetryAfterValidated", func(t *testing.T) {
		t.Parallel()
		_, err := limiter.New(redistest.Client(t), &limiter.Config{MaxRetryAfter: time.Millisecond})
		require.ErrorContains(t, err, "MaxRetryAfter")
	})
}

func requireTime(t *testing.T, want, got time.Time) {
	t.Helper()
	require.True(t, want.Equal(got), "want %s, got %s", want.UTC(), got.UTC())
}
