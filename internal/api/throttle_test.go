package api

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/clocktest"
	"github.com/llmq/llmq/internal/logtest"
)

// TestStreamWarn_LastSuppressedAreLogged: the streams' failures held back by the throttle are
// logged once its interval has passed even when no failure follows (the end of an outage): their
// count was written only with the next line, so the last failures of an outage were never.
func TestStreamWarn_LastSuppressedAreLogged(t *testing.T) {
	t.Parallel()
	var logs logtest.Buffer
	clock := clocktest.New(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	b := setup(t, setupOpts{noListener: true, now: clock.Now, logger: slog.New(slog.NewJSONHandler(&logs, nil))})
	var mu sync.Mutex
	var timers []func()
	var delays []time.Duration
	b.srv.streamLog.SetAfterFunc(func(d time.Duration, f func()) func() bool {
		mu.Lock()
		defer mu.Unlock()
		timers, delays = append(timers, f), append(delays, d)
		return func() bool { return true }
	})
	fire := func() {
		t.Helper()
		mu.Lock()
		require.NotEmpty(t, timers, "no report scheduled")
		f := timers[0]
		timers = timers[1:]
		mu.Unlock()
		f()
	}
	ctx := context.Background()
	failed := errors.New("connection refused")

	for range 3 {
		b.srv.streamWarn(ctx, "renew event watch", "job-1", failed)
	}
	clock.Advance(4 * time.Second)
	b.srv.streamWarn(ctx, "renew event watch", "job-2", failed)
	require.Equal(t, 1, logs.Count(`"msg":"renew event watch"`), logs.String())
	require.Equal(t, []time.Duration{streamLogInterval}, delays, "one report, an interval after the line")

	fire() // on time by the wall clock, early by the throttle's: scheduled again for the rest
	require.Equal(t, 1, logs.Count(`"msg":"renew event watch"`), logs.String())
	require.Equal(t, []time.Duration{streamLogInterval, 6 * time.Second}, delays)
	clock.Advance(6 * time.Second)
	fire()
	require.Equal(t, 2, logs.Count(`"msg":"renew event watch"`), logs.String())
	require.Equal(t, 1, logs.Count(`"suppressed":3`), "the three held back: %s", logs.String())

	// The report counts as a line: the next failure within the interval is held back again, and
	// one after it is logged with no count left over.
	b.srv.streamWarn(ctx, "renew event watch", "job-3", failed)
	clock.Advance(streamLogInterval)
	b.srv.streamWarn(ctx, "renew event watch", "job-4", failed)
	fire() // the report of job-3's: counted in job-4's line already
	require.Equal(t, 3, logs.Count(`"msg":"renew event watch"`), logs.String())
	require.Equal(t, 1, logs.Count(`"suppressed":1`), logs.String())

	b.srv.streamWarn(ctx, "renew event watch", "job-5", failed)
	b.srv.Shutdown()
	mu.Lock()
	require.Len(t, timers, 1)
	mu.Unlock()
	clock.Advance(streamLogInterval)
	fire() // due, but stopped: nothing more is logged after Shutdown
	require.Equal(t, 3, logs.Count(`"msg":"renew event watch"`), logs.String())
}

// TestStreamWarn_ReportNamesTheLastJobAndError: the report of the streams' failures that the
// throttle held back (the last of an outage: watch renewals that failed after the line) said
// only how many: "renew event watch suppressed=2", no job for an operator to look at, nor the
// error they failed with (a different one, maybe, than the line's ten seconds before). It is now
// the last one held back's line, its job and error, counting them all.
func TestStreamWarn_ReportNamesTheLastJobAndError(t *testing.T) {
	t.Parallel()
	var logs logtest.Buffer
	clock := clocktest.New(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	b := setup(t, setupOpts{noListener: true, now: clock.Now, logger: slog.New(slog.NewJSONHandler(&logs, nil))})
	var timers manualTimers
	b.srv.streamLog.SetAfterFunc(timers.afterFunc)
	ctx := context.Background()

	b.srv.streamWarn(ctx, "renew event watch", "job-1", errors.New("connection refused"))
	b.srv.streamWarn(ctx, "renew event watch", "job-2", errors.New("connection refused"))
	b.srv.streamWarn(ctx, "renew event watch", "job-3", errors.New("timeout: no connection within 5s"))
	require.Equal(t, 1, logs.Count(`"msg":"renew event watch","job_id":"job-1","error":"connection refused","suppressed":0`), logs.String())
	clock.Advance(streamLogInterval)
	timers.fire(t)
	require.Equal(t, 1, logs.Count(`"msg":"renew event watch","job_id":"job-3","error":"timeout: no connection within 5s","suppressed":2`),
		"the report names the last job held back and its error: %s", logs.String())

	// A line allowed after the report names its own job, and no one held back.
	clock.Advance(streamLogInterval)
	b.srv.streamWarn(ctx, "renew event watch", "job-4", errors.New("connection refused"))
	require.Equal(t, 1, logs.Count(`"job_id":"job-4","error":"connection refused","suppressed":0`), logs.String())
}
