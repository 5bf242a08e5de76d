package limiter_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/breaker"
	"github.com/llmq/llmq/internal/limiter"
	"github.com/llmq/llmq/internal/redistest"
	"github.com/llmq/llmq/internal/tokens"
)

// AttemptOptions.Circuit makes the breaker's own test for admitting without writing, in the
// reservation's script, and agrees with breaker.Circuit.Allow in every state: it grants only on
// a closed breaker that has heard a success within its memory (or has no cold-start cap), with
// the breaker's generation, so that outcomes reported on the admission count; in any other
// state it refuses before anything else (the pause included) and reserves nothing.
func TestReserveAttempt_CircuitTestAgreesWithTheBreaker(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := setup(t, nil)
	rdb := redistest.Client(t)
	lim := limiter.Limit{Rate: 1, Burst: 1} // a second reservation would wait: "reserved" shows
	newBreaker := func(memory time.Duration) *breaker.Breaker {
		brk, err := breaker.New(rdb, &breaker.Config{Prefix: b.prefix, Now: b.clock.Now, Threshold: 2,
			Cooldown: time.Minute, SuccessMemory: memory})
		require.NoError(t, err)
		return brk
	}
	brk := newBreaker(time.Minute)
	ask := func(id string, c *breaker.Circuit) limiter.Reservation {
		t.Helper()
		r, err := b.lim.Gate(id, id).ReserveAttempt(ctx, lim, tokens.Cost{}, limiter.AttemptOptions{UnlessPaused: true,
			Circuit: &limiter.CircuitCheck{Key: c.Key(), SuccessMemory: c.SuccessMemory()}})
		require.NoError(t, err)
		return r
	}
	// refused checks a refusal that reserved nothing: the gate's only slot is still free.
	refused := func(id string, c *breaker.Circuit) {
		t.Helper()
		require.Equal(t, limiter.Reservation{CircuitRefused: true}, ask(id, c))
		r, err := b.lim.Gate(id, id).Reserve(ctx, lim)
		require.NoError(t, err)
		require.True(t, r.Granted)
		require.Zero(t, r.Wait, "the refusal reserved nothing")
	}
	// warm makes c's breaker hear a success.
	warm := func(c *breaker.Circuit) {
		t.Helper()
		a, err := c.Allow(ctx)
		require.NoError(t, err)
		require.True(t, a.Allowed)
		_, err = c.Report(ctx, a, breaker.Success)
		require.NoError(t, err)
	}

	// A breaker never used is cold: Allow would cap it, the test refuses
	refused("cold", brk.Circuit("cold", "cold"))

	// With the cold-start cap off, a breaker never used admits at generation 0
	off := newBreaker(-1).Circuit("nocap", "nocap")
	require.Zero(t, off.SuccessMemory())
	r := ask("nocap", off)
	require.True(t, r.Granted)
	require.Zero(t, r.CircuitGen)

	// failTwice reports the threshold's failures on two admissions of the test, which open the
	// breaker only if they carry its generation (a stale admission's report is ignored).
	failTwice := func(id string, c *breaker.Circuit) {
		t.Helper()
		for range 2 {
			b.clock.Advance(2 * time.Second) // each ask a fresh slot
			r := ask(id, c)
			require.True(t, r.Granted)
			_, err := c.Report(ctx, c.ClosedAdmission(r.CircuitGen), breaker.Failure)
			require.NoError(t, err)
		}
		st, err := c.Status(ctx)
		require.NoError(t, err)
		require.Equal(t, breaker.Open, st.State, "the admissions' failures counted")
	}

	// A warm closed breaker admits, and failures reported on that admission open it
	c := brk.Circuit("warm", "warm")
	warm(c)
	failTwice("warm", c)

	// An open breaker refuses, before the pause check: a paused credential's refusal is the
	// breaker's
	b.clock.Advance(2 * time.Second)
	_, err := b.lim.Gate("warm", "warm").Pause(ctx, "spend_cap", "job-1")
	require.NoError(t, err)
	require.Equal(t, limiter.Reservation{CircuitRefused: true}, ask("warm", c))
	_, err = b.lim.Gate("warm", "warm").Resume(ctx)
	require.NoError(t, err)
	refused("warm", c)

	// A half-open breaker (its probe out) refuses
	b.clock.Advance(time.Minute)
	a, err := c.Allow(ctx)
	require.NoError(t, err)
	require.True(t, a.Probe)
	b.clock.Advance(2 * time.Second)
	refused("warm", c)

	// Its probe's success closes it, warm: admitted again
	_, err = c.Report(ctx, a, breaker.Success)
	require.NoError(t, err)
	b.clock.Advance(2 * time.Second)
	r = ask("warm", c)
	require.True(t, r.Granted)
	require.Positive(t, r.CircuitGen, "a generation later than the first")

	// A success older than the memory leaves it cold again: refused
	b.clock.Advance(time.Minute)
	refused("warm", c)

	// Warm again, the admissions carry the new generation: their failures open it
	warm(c)
	failTwice("warm", c)
}

// The breaker's hash comes after the fair queue's keys: with a lane and the report of a burst's
// send, the test still reads the breaker (an open one refuses, a warm one admits at its
// generation).
func TestReserveAttempt_CircuitTestWithALane(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := setup(t, nil)
	brk, err := breaker.New(redistest.Client(t), &breaker.Config{Prefix: b.prefix, Now: b.clock.Now, Threshold: 1,
		Cooldown: time.Minute})
	require.NoError(t, err)
	c := brk.Circuit("laned", "laned")
	ask := func(ticket string) limiter.Reservation {
		t.Helper()
		r, err := b.lim.Gate("laned", "laned").ReserveAttempt(ctx, limiter.Limit{Rate: 100, Burst: 10}, tokens.Cost{},
			limiter.AttemptOptions{UnlessPaused: true, FirstAttempt: true, ReportSend: true,
				Lane:    &limiter.Lane{Tenant: "acme", Priority: limiter.PriorityNormal, Ticket: ticket, Since: b.clock.Now()},
				Circuit: &limiter.CircuitCheck{Key: c.Key(), SuccessMemory: c.SuccessMemory()}})
		require.NoError(t, err)
		return r
	}

	require.True(t, ask("job-1").CircuitRefused, "cold")
	a, err := c.Allow(ctx)
	require.NoError(t, err)
	_, err = c.Report(ctx, a, breaker.Success)
	require.NoError(t, err)

	r := ask("job-2")
	require.True(t, r.Granted, "warm")
	_, err = c.Report(ctx, c.ClosedAdmission(r.CircuitGen), breaker.Failure)
	require.NoError(t, err)
	require.True(t, ask("job-3").CircuitRefused, "opened by the failure reported on the admission")
}
