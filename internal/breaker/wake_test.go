package breaker_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/breaker"
	"github.com/llmq/llmq/internal/clocktest"
	"github.com/llmq/llmq/internal/redistest"
)

// TestBreaker_Listen checks that the Report of a probe wakes the callers another process
// refused, and that ordinary reports of a warm closed breaker publish nothing; on a Redis
// Cluster too, where the publisher and the subscribers may be connected to different nodes.
func TestBreaker_Listen(t *testing.T) {
	t.Parallel()
	redistest.OnEach(t, func(t *testing.T, r redistest.Target) {
		prefix := redistest.PrefixOn(t, r.URL)
		clock := clocktest.New(t0)
		cfg := breaker.Config{Prefix: prefix, Now: clock.Now, Threshold: 2, SuccessMemory: -1}
		newCred := func() (*breaker.Breaker, *breaker.Circuit) {
			c := cfg
			b, err := breaker.New(redistest.ClientOf(t, r.URL), &c)
			require.NoError(t, err)
			return b, b.Circuit(testID, testName)
		}
		listener, waiting := newCred()
		_, prober := newCred()

		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan struct{})
		go func() {
			defer close(done)
			listener.Listen(ctx)
		}()
		t.Cleanup(func() {
			cancel()
			<-done
		})

		// Watch the wake channel from a third client, to count what is published.
		raw := redistest.ClientOf(t, r.URL)
		sub := raw.Subscribe(t.Context(), prefix+"cb:wake")
		t.Cleanup(func() { _ = sub.Close() })
		_, err := sub.Receive(t.Context())
		require.NoError(t, err)
		require.Eventually(t, func() bool {
			n, err := redistest.NumSub(t.Context(), raw, prefix+"cb:wake")
			return err == nil && n == 2
		}, 30*time.Second, 5*time.Millisecond, "Listen never subscribed")

		report := func(c *breaker.Circuit, o breaker.Outcome) {
			t.Helper()
			a, err := c.Allow(t.Context())
			require.NoError(t, err)
			require.True(t, a.Allowed)
			_, err = c.Report(t.Context(), a, o)
			require.NoError(t, err)
		}
		// A warm closed breaker: reports publish nothing.
		for range 3 {
			report(prober, breaker.Success)
		}
		report(prober, breaker.Failure)
		report(prober, breaker.Failure) // opens

		clock.Advance(breaker.DefaultCooldown)
		wake := waiting.Wakeup()
		probe, err := prober.Allow(t.Context())
		require.NoError(t, err)
		require.True(t, probe.Probe)
		refused, err := waiting.Allow(t.Context())
		require.NoError(t, err)
		require.False(t, refused.Allowed)
		require.Equal(t, breaker.HalfOpen, refused.State)
		select {
		case <-wake:
			t.Fatal("woken before the probe reported")
		default:
		}

		_, err = prober.Report(t.Context(), probe, breaker.Success)
		require.NoError(t, err)
		select {
		case <-wake:
		case <-time.After(30 * time.Second):
			t.Fatal("the probe's report did not wake the refused caller")
		}
		again, err := waiting.Allow(t.Context())
		require.NoError(t, err)
		require.True(t, again.Allowed)

		// Exactly one message (the probe's) before a sentinel published after it.
		require.NoError(t, raw.Publish(t.Context(), prefix+"cb:wake", "end").Err())
		var got []string
		for m := range sub.Channel() {
			if m.Payload == "end" {
				break
			}
			got = append(got, m.Payload)
		}
		require.Len(t, got, 1)
	})
}

// TestAwait: a wake-up, the wait's end and ctx's each end Await. Each case ends within 10 s
// whatever Await does: one that misses what should end it fails the test instead of hanging it
// (for an hour) until go test's -timeout.
func TestAwait(t *testing.T) {
	t.Parallel()
	bounded, stop := context.WithTimeout(t.Context(), 30*time.Second)
	defer stop()
	woken := make(chan struct{})
	close(woken)
	require.NoError(t, breaker.Await(bounded, woken, time.Hour), "the wake-up ends the wait")
	require.NoError(t, breaker.Await(bounded, nil, time.Nanosecond))
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	require.ErrorIs(t, breaker.Await(ctx, nil, 10*time.Second), context.Canceled, "ctx ends the wait")
}
