package limiter_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/clocktest"
	"github.com/llmq/llmq/internal/limiter"
	"github.com/llmq/llmq/internal/redistest"
	"github.com/llmq/llmq/internal/tokens"
)

func TestCredential_AllowRetry(t *testing.T) {
	t.Parallel()

	t.Run("FailureStorm", func(t *testing.T) {
		t.Parallel()
		b := setup(t, nil)
		id := "sk-storm"
		creds := []*limiter.Gate{b.lim.Gate(id, "main"), b.lim2.Gate(id, "main")}
		// 1,000 first attempts from 50 workers over two clients; every one fails and asks to
		// retry, and every granted retry fails and asks again.
		var allowed, firsts atomic.Int64
		var wg sync.WaitGroup
		for w := range 50 {
			wg.Go(func() {
				c := creds[w%2]
				for range 20 {
					// counted here before Redis, allowed after: the check below is conservative
					firsts.Add(1)
					if err := c.RecordAttempt(t.Context()); err != nil {
						t.Error(err)
						return
					}
					for {
						ok, err := c.AllowRetry(t.Context(), "")
						if err != nil {
							t.Error(err)
							return
						}
						if !ok {
							break
						}
						// never more than floor + 10% of the first attempts so far
						if a := allowed.Add(1); float64(a) > 10+0.1*float64(firsts.Load()) {
							t.Errorf("%d retries allowed after %d first attempts", a, firsts.Load())
						}
					}
				}
			})
		}
		wg.Wait()
		require.Equal(t, int64(1000), firsts.Load())
		require.Equal(t, int64(10+100), allowed.Load(), "retries = floor + 10% of first attempts")
		// Every job's last ask was refused; only the first client's half have metrics.
		require.Equal(t, 500.0, b.metric(t, "llmq_retry_budget_refusals_total", "main"))
	})

	t.Run("TimeoutsHaveTheirOwnAllowance", func(t *testing.T) {
		t.Parallel()
		b := setup(t, func(c *limiter.Config) { c.Budget = limiter.Budget{Floor: 2, Ratio: 0.5} })
		c := b.lim.Gate("sk-timeouts", "main")
		for range 2 {
			require.NoError(t, c.RecordAttempt(t.Context()))
		}
		drain := func(allow func() (bool, error)) int {
			n := 0
			for {
				ok, err := allow()
				require.NoError(t, err)
				if !ok {
					return n
				}
				n++
			}
		}
		// A storm of timeouts spends only the timeout allowance (2 + 0.5 × 2) ...
		require.Equal(t, 3, drain(func() (bool, error) { return c.AllowTimeoutRetry(t.Context(), "") }))
		// ... and the error retries still have all of theirs.
		require.Equal(t, 3, drain(func() (bool, error) { return c.AllowRetry(t.Context(), "") }))
	})

	t.Run("WindowSlides", func(t *testing.T) {
		t.Parallel()
		b := setup(t, func(c *limiter.Config) { c.Budget = limiter.Budget{Floor: 2, Ratio: 0.5} })
		c := b.lim.Gate("sk-slide", "main")
		allow := func() bool {
			ok, err := c.AllowRetry(t.Context(), "")
			require.NoError(t, err)
			return ok
		}
		// A quiet credential still gets its floor.
		require.True(t, allow())
		require.True(t, allow())
		require.False(t, allow())
		// Four first attempts earn two more.
		for range 4 {
			require.NoError(t, c.RecordAttempt(t.Context()))
		}
		require.True(t, allow())
		require.True(t, allow())
		require.False(t, allow())
		// Within the window nothing is forgotten; after it (window + one 5 s bucket) all is.
		b.clock.Advance(55 * time.Second)
		require.False(t, allow())
		b.clock.Advance(10 * time.Second)
		require.True(t, allow())
		require.True(t, allow())
		require.False(t, allow())
	})

	// A retry asked for again while the budget stays spent (a deferred retry's look again, from
	// any process) is one refusal; another retry is another, and a retry not asked for during a
	// whole window is counted again.
	t.Run("RefusalCountedOncePerRetry", func(t *testing.T) {
		t.Parallel()
		b := setup(t, func(c *limiter.Config) { c.Budget = limiter.Budget{Floor: 1, Ratio: 0.5} })
		c, c2 := b.lim.Gate("sk-refused", "main"), b.lim2.Gate("sk-refused", "main")
		ok, err := c.AllowRetry(t.Context(), "job-1:1")
		require.NoError(t, err)
		require.True(t, ok, "the floor")
		refusals := func() float64 { return b.metric(t, "llmq_retry_budget_refusals_total", "main") }
		for range 3 {
			ok, err := c.AllowRetry(t.Context(), "job-2:1")
			require.NoError(t, err)
			require.False(t, ok)
			_, err = c2.AllowRetry(t.Context(), "job-2:1") // another process's look again
			require.NoError(t, err)
			b.clock.Advance(time.Second)
		}
		require.Equal(t, 1.0, refusals(), "one retry, refused six times")
		ok, err = c.AllowTimeoutRetry(t.Context(), "job-3:1")
		require.NoError(t, err)
		require.True(t, ok, "the timeouts' own floor")
		ok, err = c.AllowTimeoutRetry(t.Context(), "job-3:2")
		require.NoError(t, err)
		require.False(t, ok)
		require.Equal(t, 2.0, refusals(), "another retry")
		b.clock.Advance(61 * time.Second) // the window (60 s): the refusals are forgotten
		ok, err = c.AllowRetry(t.Context(), "job-1:2")
		require.NoError(t, err)
		require.True(t, ok, "a new window's floor")
		_, err = c.AllowRetry(t.Context(), "job-2:1")
		require.NoError(t, err)
		require.Equal(t, 3.0, refusals(), "a retry not asked for in a window is counted again")
		_, err = c.AllowRetry(t.Context(), "")
		require.NoError(t, err)
		require.Equal(t, 4.0, refusals(), "an unnamed retry counts each refusal")
	})
	// A look (RetryAllowed, TimeoutRetryAllowed) answers as the draw would, spends nothing, and
	// its refusal is the retry's one refusal, shared with the draw's: a retry looked at, then
	// drawn on and refused, counts once.
	t.Run("LookSpendsNothing", func(t *testing.T) {
		t.Parallel()
		b := setup(t, func(c *limiter.Config) { c.Budget = limiter.Budget{Floor: 1, Ratio: 0.5} })
		c := b.lim.Gate("sk-look", "main")
		refusals := func() float64 { return b.metric(t, "llmq_retry_budget_refusals_total", "main") }
		for range 3 {
			ok, err := c.RetryAllowed(t.Context(), "job-1:1", nil)
			require.NoError(t, err)
			require.True(t, ok, "the floor, looked at")
		}
		ok, err := c.AllowRetry(t.Context(), "job-1:1")
		require.NoError(t, err)
		require.True(t, ok, "the floor, unspent by the looks")
		for range 3 {
			ok, err := c.RetryAllowed(t.Context(), "job-2:1", nil)
			require.NoError(t, err)
			require.False(t, ok, "spent")
			b.clock.Advance(time.Second)
		}
		ok, err = c.AllowRetry(t.Context(), "job-2:1")
		require.NoError(t, err)
		require.False(t, ok)
		require.Equal(t, 1.0, refusals(), "one retry, looked at and drawn on")
		ok, err = c.TimeoutRetryAllowed(t.Context(), "job-3:1", nil)
		require.NoError(t, err)
		require.True(t, ok, "the timeouts' own allowance")
		require.NoError(t, c.RecordAttempt(t.Context()))
		require.NoError(t, c.RecordAttempt(t.Context()))
		ok, err = c.RetryAllowed(t.Context(), "job-2:1", nil)
		require.NoError(t, err)
		require.True(t, ok, "two first attempts earn one more")
		b.clock.Advance(61 * time.Second) // the window: the first attempts are forgotten, ...
		ok, err = c.RetryAllowed(t.Context(), "job-2:1", nil)
		require.NoError(t, err)
		require.True(t, ok, "... and so is the retry drawn: the floor again")
		lane := &limiter.Lane{Tenant: "acme", Ticket: "job-2"}
		_, err = c.RetryAllowed(t.Context(), "", lane)
		require.ErrorContains(t, err, "needs the retry's name")
		_, err = c.TimeoutRetryAllowed(t.Context(), "job-2:1", &limiter.Lane{Tenant: "a|b", Ticket: "job-2"})
		require.ErrorContains(t, err, "lane tenant")
	})
}

// TestGate_RefusedLookTakesTheTicketOut: a retry's ticket waiting in its lane (told to come back
// for its turn) is taken out when a look at the budget refuses the retry, so that a newer ticket
// of the lane takes the free slot; without the lane named, or when the look allows the retry, it
// stays ranked before the newer one.
// On a Redis Cluster too: the lane's keys share the budget's slot.
func TestGate_RefusedLookTakesTheTicketOut(t *testing.T) {
	t.Parallel()
	redistest.OnEach(t, func(t *testing.T, target redistest.Target) {
		clock := clocktest.New(t0)
		l, err := limiter.New(redistest.ClientOf(t, target.URL), &limiter.Config{Prefix: redistest.PrefixOn(t, target.URL),
			Now: clock.Now})
		require.NoError(t, err)
		ctx := t.Context()
		lim := limiter.Limit{Rate: 1, Burst: 1}
		ask := func(g *limiter.Gate, lane *limiter.Lane) bool {
			t.Helper()
			r, err := g.ReserveAttempt(ctx, lim, tokens.Cost{}, limiter.AttemptOptions{Lane: lane})
			require.NoError(t, err)
			return r.Granted
		}
		retry := &limiter.Lane{Tenant: "acme", Ticket: "job-r", Since: t0.Add(-time.Minute)}
		newer := &limiter.Lane{Tenant: "acme", Ticket: "job-n", Since: t0}
		var gates []*limiter.Gate
		for i, id := range []string{"sk-out", "sk-kept", "sk-allowed"} {
			g := l.Gate(id, id)
			gates = append(gates, g)
			require.True(t, ask(g, &limiter.Lane{Tenant: "other", Ticket: "job-o", Since: t0}), "the free slot")
			require.False(t, ask(g, retry), "told to come back: its ticket waits in its lane")
			for spent := i == 2; !spent; {
				ok, err := g.AllowRetry(ctx, "")
				require.NoError(t, err)
				spent = !ok
			}
		}
		ok, err := gates[0].RetryAllowed(ctx, "job-r:1", retry)
		require.NoError(t, err)
		require.False(t, ok)
		ok, err = gates[1].RetryAllowed(ctx, "job-r:1", nil)
		require.NoError(t, err)
		require.False(t, ok)
		ok, err = gates[2].RetryAllowed(ctx, "job-r:1", retry)
		require.NoError(t, err)
		require.True(t, ok)
		clock.Advance(2 * time.Second)
		require.True(t, ask(gates[0], newer), "the retry's ticket was taken out")
		require.False(t, ask(gates[1], newer), "the retry's ticket ranks first")
		require.False(t, ask(gates[2], newer), "allowed, the retry's ticket ranks first")
	})
}

// TestGate_LookAnswersAsTheDraw: a look reads the budget as the draw counts it (the same buckets,
// window, floor and ratio, for either kind): over first attempts and retries spread across more
// than a window, each look answers as the draw after it, also while the budget hash still holds
// buckets older than the window, which only a draw deletes.
func TestGate_LookAnswersAsTheDraw(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *limiter.Config) { c.Budget = limiter.Budget{Floor: 2, Ratio: 0.5} })
	g := b.lim.Gate("sk-same", "main")
	ctx := t.Context()
	type kind struct {
		look func(context.Context, string, *limiter.Lane) (bool, error)
		draw func(context.Context, string) (bool, error)
	}
	kinds := []kind{{g.RetryAllowed, g.AllowRetry}, {g.TimeoutRetryAllowed, g.AllowTimeoutRetry}}
	// each step: the seconds the clock moves on, the first attempts then counted, and the retries
	// of each kind then looked at and drawn on. At 65 s the first attempts of 0 s have left the
	// window, their bucket not yet deleted, while the retries of 50 s are in it.
	steps := [][3]int{{0, 6, 0}, {50, 0, 2}, {15, 0, 3}, {7, 0, 6}, {3, 2, 6}, {20, 0, 6}, {25, 1, 6},
		{9, 0, 6}, {61, 0, 6}, {4, 4, 6}, {59, 0, 6}, {2, 0, 6}, {130, 0, 6}}
	answers := map[bool]int{}
	for i, s := range steps {
		b.clock.Advance(time.Duration(s[0]) * time.Second)
		for range s[1] {
			require.NoError(t, g.RecordAttempt(ctx))
		}
		for k, kd := range kinds {
			for j := range s[2] {
				name := fmt.Sprintf("job-%d-%d-%d:1", i, k, j)
				look, err := kd.look(ctx, name, nil)
				require.NoError(t, err)
				draw, err := kd.draw(ctx, name)
				require.NoError(t, err)
				require.Equal(t, draw, look, "step %d, kind %d, retry %d", i, k, j)
				answers[draw]++
			}
		}
	}
	require.Positive(t, answers[true])
	require.Positive(t, answers[false])
}
