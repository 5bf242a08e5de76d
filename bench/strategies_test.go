package main

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/llmsim"
)

func constant(v float64) func() float64 { return func() float64 { return v } }

func TestTenPercentJitter(t *testing.T) {
	t.Parallel()
	d := tenPercentJitter(500 * time.Millisecond)
	for _, tc := range []struct {
		name    string
		attempt int
		u       float64
		want    time.Duration
	}{
		{"FirstRetryLow", 0, 0, 450 * time.Millisecond},
		{"FirstRetryMiddle", 0, 0.5, 500 * time.Millisecond},
		{"FirstRetryHigh", 0, 1, 550 * time.Millisecond},
		{"SecondRetryLow", 1, 0, 900 * time.Millisecond},
		{"SeventhRetryHigh", 6, 1, 35200 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			// A Retry-After is ignored by this formula.
			require.InDelta(t, tc.want, d(tc.attempt, 3*time.Second, constant(tc.u)), float64(time.Microsecond))
		})
	}
}

func TestFullJitter(t *testing.T) {
	t.Parallel()
	d := fullJitter(500*time.Millisecond, 10*time.Second)
	require.Equal(t, time.Duration(0), d(0, 0, constant(0)))
	require.Equal(t, 250*time.Millisecond, d(0, 0, constant(0.5)))
	require.Equal(t, time.Second, d(2, 0, constant(0.5)))
	// 500ms·2^6 = 32 s is above the cap.
	require.Equal(t, 5*time.Second, d(6, 0, constant(0.5)))
	require.Equal(t, time.Second, d(2, 7*time.Second, constant(0.5)), "full jitter ignores Retry-After")
}

func TestRetryAfterJitter(t *testing.T) {
	t.Parallel()
	d := retryAfterJitter(500*time.Millisecond, 10*time.Second)
	require.Equal(t, time.Second+250*time.Millisecond, d(0, time.Second, constant(0.5)))
	require.Equal(t, 2*time.Second+time.Second, d(2, 2*time.Second, constant(0.5)))
	require.Equal(t, 500*time.Millisecond, d(1, 0, constant(0.5)), "without Retry-After it is full jitter")
}

func TestParseRetryAfter(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	require.Equal(t, time.Duration(0), parseRetryAfter("", now))
	require.Equal(t, 2*time.Second, parseRetryAfter("2", now))
	require.Equal(t, time.Duration(0), parseRetryAfter("-3", now))
	require.Equal(t, time.Duration(0), parseRetryAfter("soon", now))
	require.Equal(t, 30*time.Second, parseRetryAfter(now.Add(30*time.Second).Format(http.TimeFormat), now))
	require.Equal(t, time.Duration(0), parseRetryAfter(now.Add(-time.Minute).Format(http.TimeFormat), now))
}

func TestCallResult_Retryable(t *testing.T) {
	t.Parallel()
	for status, want := range map[int]bool{200: false, 400: false, 401: false, 408: true, 429: true, 500: true, 529: true} {
		require.Equal(t, want, callResult{status: status}.retryable(), "status %d", status)
	}
	require.True(t, callResult{err: http.ErrHandlerTimeout}.retryable())
}

func TestRunStrategy(t *testing.T) {
	t.Parallel()
	// A bucket of 2 that practically never refills: exactly 2 jobs can succeed.
	setup := func(t *testing.T, n int) (*rowEnv, *llmsim.Server) {
		t.Helper()
		sim := llmsim.New(llmsim.Config{Capacity: 2, RefillPerSecond: 0.001})
		srv := httptest.NewServer(sim)
		t.Cleanup(srv.Close)
		e := &rowEnv{burst: burst{shared: &shared{n: n, seed: 1, timeout: time.Minute}}, simURL: srv.URL, apiKey: "sk-test",
			progress: &progress{}, log: func(string, ...any) {}, started: func() {}}
		return e, sim
	}
	count := func(outs []outcome) (done, ok int) {
		for _, o := range outs {
			if o.done {
				done++
			}
			if o.ok {
				ok++
			}
		}
		return done, ok
	}
	t.Run("NoRetry", func(t *testing.T) {
		t.Parallel()
		e, sim := setup(t, 5)
		outs := runStrategy(context.Background(), e, strategy{attempts: 1})
		done, ok := count(outs)
		require.Equal(t, 5, done)
		require.Equal(t, 2, ok)
		require.EqualValues(t, 5, e.progress.done.Load())
		require.EqualValues(t, 2, e.progress.ok.Load())
		st := sim.Stats()
		require.Equal(t, 5, st.Requests)
		require.Equal(t, 3, st.ByStatus[429])
	})
	t.Run("RetriesUpToAttempts", func(t *testing.T) {
		t.Parallel()
		e, sim := setup(t, 5)
		var calls atomic.Int64
		s := strategy{attempts: 3, delay: func(attempt int, retryAfter time.Duration, u func() float64) time.Duration {
			calls.Add(1)
			require.Positive(t, retryAfter, "the simulator's 429 carries Retry-After")
			return time.Millisecond
		}}
		outs := runStrategy(context.Background(), e, s)
		done, ok := count(outs)
		require.Equal(t, 5, done)
		require.Equal(t, 2, ok)
		require.EqualValues(t, 3*2, calls.Load(), "3 failing jobs wait twice each")
		require.Equal(t, 2+3*3, sim.Stats().Requests)
	})
	t.Run("CanceledWhileWaitingMeansNotDone", func(t *testing.T) {
		t.Parallel()
		e, sim := setup(t, 1)
		c := newSimClient(e.simURL, e.apiKey, 1)
		defer c.close()
		for i := range 2 { // empty the bucket
			require.Equal(t, http.StatusOK, c.call(context.Background(), i).status)
		}
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		s := strategy{attempts: 8, delay: func(int, time.Duration, func() float64) time.Duration {
			cancel()
			return time.Hour
		}}
		out := runClient(ctx, c, s, 0, constant(0.5), time.Now())
		require.False(t, out.done)
		require.Equal(t, 3, sim.Stats().Requests, "no call after the cancel")
	})
}
