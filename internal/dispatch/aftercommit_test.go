package dispatch_test

import (
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/dispatch"
)

// elapsed is an AfterCommitConfig.After whose wait has always passed: Run waits for nothing
// but a function that has returned already.
func elapsed(time.Duration) <-chan time.Time {
	c := make(chan time.Time, 1)
	c <- time.Time{}
	return c
}

// TestAfterCommit_PastMaxPendingRefusesAtOnce: with Redis stalled, every Run's function stays
// in the background; past MaxPending of them Run starts no more (during a stall of minutes
// they were unbounded: a goroutine and a command per submit, all sent at once when Redis
// answered again) and refuses at once, counted, leaving the work to the sweeper. Once a
// function returns, its place is free again.
func TestAfterCommit_PastMaxPendingRefusesAtOnce(t *testing.T) {
	t.Parallel()
	a := dispatch.NewAfterCommit(&dispatch.AfterCommitConfig{MaxPending: 3, After: elapsed})
	stall := make(chan struct{})
	var started atomic.Int64
	stalled := func() error {
		started.Add(1)
		<-stall
		return errors.New("redis went away")
	}
	for range 3 {
		require.ErrorIs(t, a.Run(stalled), dispatch.ErrRedisWait)
	}
	for range 5 {
		require.ErrorIs(t, a.Run(stalled), dispatch.ErrAfterCommitFull)
	}
	require.Equal(t, 3, a.Pending())
	require.EqualValues(t, 5, a.Refused())
	require.Eventually(t, func() bool { return started.Load() == 3 }, 30*time.Second, time.Millisecond)

	reg := prometheus.NewRegistry()
	reg.MustRegister(a)
	require.Equal(t, 3.0, metricValue(t, reg, "llmq_api_after_commit_pending"))
	require.Equal(t, 5.0, metricValue(t, reg, "llmq_api_after_commit_refused_total"))

	close(stall) // Redis answers (or the client gives up)
	require.Eventually(t, func() bool { return a.Pending() == 0 }, 30*time.Second, time.Millisecond)
	ran := make(chan struct{})
	err := a.Run(func() error { close(ran); return nil }) // its answer or the wait's end: either may come first
	require.NotErrorIs(t, err, dispatch.ErrAfterCommitFull)
	select {
	case <-ran:
	case <-time.After(30 * time.Second):
		t.Fatal("a place was free: the function ran")
	}
	require.EqualValues(t, 5, a.Refused())
	require.Eventually(t, func() bool { return a.Pending() == 0 }, 30*time.Second, time.Millisecond)
}

// TestAfterCommit_WaitsForAnAnswerWithinWait: a function that returns in time is waited for,
// its error returned, and its place freed.
func TestAfterCommit_WaitsForAnAnswerWithinWait(t *testing.T) {
	t.Parallel()
	a := dispatch.NewAfterCommit(&dispatch.AfterCommitConfig{MaxPending: 1,
		After: func(time.Duration) <-chan time.Time { return nil }}) // never: only the answer ends the wait
	boom := errors.New("boom")
	require.ErrorIs(t, a.Run(func() error { return boom }), boom)
	require.Eventually(t, func() bool { return a.Pending() == 0 }, 30*time.Second, time.Millisecond)
	require.NoError(t, a.Run(func() error { return nil }))
	require.Zero(t, a.Refused())
}

// metricValue is the value of reg's metric name (a gauge or a counter without labels).
func metricValue(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	families, err := reg.Gather()
	require.NoError(t, err)
	for _, f := range families {
		if f.GetName() == name {
			m := f.GetMetric()[0]
			return m.GetGauge().GetValue() + m.GetCounter().GetValue()
		}
	}
	t.Fatalf("no metric %s", name)
	return 0
}
