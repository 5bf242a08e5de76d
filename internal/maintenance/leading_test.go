package maintenance_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/maintenance"
)

// TestMaintainer_LeadingDutiesRunOnlyWhileLeading: a duty of Config.Leading (the backlog's
// measurement) runs in the process that leads maintenance, from the start of its lead until it
// ends, and in no other: of two processes on one database, one runs it; when that one stops, the
// other takes the lead and runs it, never both at once.
func TestMaintainer_LeadingDutiesRunOnlyWhileLeading(t *testing.T) {
	t.Parallel()
	var active, most atomic.Int32
	started := make(chan string, 2)
	duty := func(name string) func(context.Context) {
		return func(ctx context.Context) {
			n := active.Add(1)
			for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
			}
			started <- name
			<-ctx.Done()
			active.Add(-1)
		}
	}
	cfg := maintenance.Config{Interval: 20 * time.Millisecond, Leading: []func(context.Context){duty("first")}}
	b, first := setup(t, cfg)
	cfg.Store, cfg.Now, cfg.Leading = b.Store, b.clock.Now, []func(context.Context){duty("second")}
	second := maintenance.New(cfg)

	stops := map[string]func(){"first": runLeading(t, first), "second": runLeading(t, second)}
	var leader string
	select {
	case leader = <-started:
	case <-time.After(30 * time.Second):
		t.Fatal("no process ran the duty")
	}
	stops[leader]()
	require.Zero(t, active.Load(), "the duty ends with its process's lead")
	select {
	case next := <-started:
		require.NotEqual(t, leader, next, "the other process leads now")
	case <-time.After(30 * time.Second):
		t.Fatal("the other process did not take the duty over")
	}
	require.Equal(t, int32(1), most.Load(), "never two at once")
}
