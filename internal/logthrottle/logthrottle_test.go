package logthrottle_test

import (
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/clocktest"
	"github.com/llmq/llmq/internal/logthrottle"
)

// manualTimers stands in for a Throttle's AfterFunc: the reports it schedules run when fire
// says, in the order scheduled.
type manualTimers struct {
	mu      sync.Mutex
	pending []func()
	delays  []time.Duration
	stopped int
}

func (m *manualTimers) afterFunc(d time.Duration, f func()) func() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.pending, m.delays = append(m.pending, f), append(m.delays, d)
	return func() bool {
		m.mu.Lock()
		defer m.mu.Unlock()
		m.stopped++
		return true
	}
}

// fire runs every report scheduled so far, and returns how many.
func (m *manualTimers) fire() int {
	m.mu.Lock()
	due := m.pending
	m.pending = nil
	m.mu.Unlock()
	for _, f := range due {
		f()
	}
	return len(due)
}

// report is one call of a Throttle's Report.
type report struct {
	key        string
	level      slog.Level
	suppressed int
	last       []any
}

// testBundle is a Throttle of a minute on a clock and timers of the test's, its reports kept.
type testBundle struct {
	th     *logthrottle.Throttle
	clock  *clocktest.Clock
	timers *manualTimers

	mu      sync.Mutex
	reports []report
}

func setup(t *testing.T, cfg logthrottle.Config) *testBundle {
	t.Helper()
	b := &testBundle{clock: clocktest.New(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)),
		timers: &manualTimers{}}
	cfg.Every, cfg.Now, cfg.AfterFunc = time.Minute, b.clock.Now, b.timers.afterFunc
	if cfg.Report == nil {
		cfg.Report = func(key string, level slog.Level, suppressed int, last []any) {
			b.mu.Lock()
			defer b.mu.Unlock()
			b.reports = append(b.reports, report{key, level, suppressed, last})
		}
	}
	b.th = logthrottle.New(&cfg)
	return b
}

func (b *testBundle) reported() []report {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]report(nil), b.reports...)
}

// TestThrottle_ReportsTheLastHeldBackAtTheHighestLevel: a key's first event is let through, the
// others within the interval are held back and reported once it has passed, in one report with
// their count, the last one's attrs and the highest level among them; the report counts as a
// line (the interval starts again from it), and another key is let through at once.
func TestThrottle_ReportsTheLastHeldBackAtTheHighestLevel(t *testing.T) {
	t.Parallel()
	b := setup(t, logthrottle.Config{})

	ok, n := b.th.Allow("a", "try", 1)
	require.True(t, ok)
	require.Zero(t, n)
	for i, level := range []slog.Level{slog.LevelWarn, slog.LevelError, slog.LevelInfo} {
		b.clock.Advance(10 * time.Second)
		ok, _ = b.th.AllowAt("a", level, "try", i+2)
		require.False(t, ok, "held back within the interval")
	}
	ok, n = b.th.Allow("b", "try", 1)
	require.True(t, ok, "another key is let through at once")
	require.Zero(t, n)
	require.Equal(t, []time.Duration{50 * time.Second}, b.timers.delays,
		"one report, at the first held back, due an interval after the key's line")

	b.clock.Advance(30 * time.Second)
	require.Equal(t, 1, b.timers.fire())
	require.Equal(t, []report{{"a", slog.LevelError, 3, []any{"try", 4}}}, b.reported())

	b.clock.Advance(time.Second)
	ok, _ = b.th.Allow("a", "try", 5)
	require.False(t, ok, "within the interval after the report")
	b.clock.Advance(time.Minute)
	ok, n = b.th.Allow("a", "try", 6)
	require.True(t, ok)
	require.Equal(t, 1, n, "a line let through before its report fired counts the one held back")
	require.Equal(t, 1, b.timers.fire())
	require.Len(t, b.reported(), 1, "nothing left to report: the line counted it")
}

// TestThrottle_StopSchedulesNoMoreReports: Stop cancels the reports scheduled and schedules
// none after; what was held back goes with the key's next line.
func TestThrottle_StopSchedulesNoMoreReports(t *testing.T) {
	t.Parallel()
	b := setup(t, logthrottle.Config{})
	b.th.Allow("a")
	b.th.Allow("a")
	b.th.Stop()
	b.th.Stop() // idempotent
	require.Equal(t, 1, b.timers.stopped, "the scheduled report is stopped")
	b.th.Allow("a")
	b.clock.Advance(time.Minute)
	require.Equal(t, 1, b.timers.fire(), "the report scheduled before Stop, fired all the same")
	require.Empty(t, b.reported())
	ok, n := b.th.Allow("a")
	require.True(t, ok)
	require.Equal(t, 2, n)
	require.Empty(t, b.timers.pending)
}

// TestThrottle_KeysPastMaxKeys: past MaxKeys, a new key drops the keys whose interval has
// passed, so that a stream of keys seen once keeps at most MaxKeys; a report pending meanwhile
// is made.
func TestThrottle_KeysPastMaxKeys(t *testing.T) {
	t.Parallel()
	b := setup(t, logthrottle.Config{MaxKeys: 100})
	b.th.Allow("held")
	b.th.Allow("held")
	for i := range 1000 {
		ok, _ := b.th.Allow(fmt.Sprint("key-", i))
		require.True(t, ok)
		require.LessOrEqual(t, logthrottle.Keys(b.th), 100)
		if i%10 == 9 {
			b.clock.Advance(time.Minute)
		}
	}
	require.Equal(t, 1, b.timers.fire())
	require.Equal(t, []report{{"held", slog.LevelWarn, 1, nil}}, b.reported())
}

// TestThrottle_ReportsRacingLinesCountEachEventOnce: reports fired while lines are allowed and
// held back concurrently count every event held back exactly once, in a line or in a report.
func TestThrottle_ReportsRacingLinesCountEachEventOnce(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var reported, lines, counted int
	b := setup(t, logthrottle.Config{Report: func(_ string, _ slog.Level, n int, _ []any) {
		mu.Lock()
		defer mu.Unlock()
		reported += n
	}})
	const workers, each = 4, 2000
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				if ok, n := b.th.Allow([]string{"a", "b"}[(w+i)%2]); ok {
					mu.Lock()
					lines++
					counted += n
					mu.Unlock()
				}
				if i%50 == 0 {
					b.clock.Advance(6 * time.Second)
				}
			}
		}()
	}
	stop := make(chan struct{})
	firer := make(chan struct{})
	go func() {
		defer close(firer)
		for {
			select {
			case <-stop:
				return
			default:
				b.timers.fire()
			}
		}
	}()
	wg.Wait()
	close(stop)
	<-firer
	for range 100 { // the last reports, due once the interval has passed
		b.clock.Advance(time.Minute)
		if b.timers.fire() == 0 {
			break
		}
	}
	mu.Lock()
	defer mu.Unlock()
	require.Empty(t, b.timers.pending, "reports still scheduled")
	require.Equal(t, workers*each, lines+counted+reported,
		"events: %d lines, %d counted in lines, %d in reports", lines, counted, reported)
}
