package dispatch_test

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/dispatch"
	"github.com/llmq/llmq/internal/jobs"
	"github.com/llmq/llmq/internal/retrypolicy"
)

// messages is a slog.Handler that hands each record's message to a channel (dropped when full).
type messages chan string

func (m messages) Enabled(context.Context, slog.Level) bool { return true }
func (m messages) Handle(_ context.Context, r slog.Record) error {
	select {
	case m <- r.Message:
	default:
	}
	return nil
}
func (m messages) WithAttrs([]slog.Attr) slog.Handler { return m }
func (m messages) WithGroup(string) slog.Handler      { return m }

// cutDelivery is a Processor whose delivery runs until its context ends, as a call does, and
// then records what came of it once the test lets it (proceed), as the executor records an
// abandoned attempt.
type cutDelivery struct {
	started, cut, proceed  chan struct{}
	startOnce, proceedOnce sync.Once
	recorded               atomic.Bool
}

func (p *cutDelivery) Process(ctx context.Context, _ dispatch.Delivery) error {
	p.startOnce.Do(func() { close(p.started) })
	<-ctx.Done()
	close(p.cut)
	<-p.proceed
	p.recorded.Store(true)
	return ctx.Err()
}

func (p *cutDelivery) letProceed() { p.proceedOnce.Do(func() { close(p.proceed) }) }

// TestServer_ShutdownWaitsForCutDeliveriesToRecord: a delivery still running when the shutdown
// timeout passes is cut (its task goes back to the queue, its context ends), and Shutdown
// returns only once it has returned, what it recorded written: the process closes its stores
// after Shutdown, and a delivery cut under it lost its attempt's record (the job held by its
// lease until it ran out, a streaming client never told to reset).
func TestServer_ShutdownWaitsForCutDeliveriesToRecord(t *testing.T) {
	t.Parallel()
	q := newServedQueue(t)
	logs := make(messages, 64)
	p := &cutDelivery{started: make(chan struct{}), cut: make(chan struct{}), proceed: make(chan struct{})}
	t.Cleanup(p.letProceed) // a failed test does not leave the delivery blocked
	srv := dispatch.NewServer(q.opt, dispatch.ServerConfig{Queue: q.name, Concurrency: 1,
		PollInterval: 10 * time.Millisecond, Policy: retrypolicy.New(&retrypolicy.Config{}),
		Logger: slog.New(logs), ShutdownTimeout: 100 * time.Millisecond})
	require.NoError(t, srv.Start(dispatch.Mux(p, q.enq)))
	shutdownDone := make(chan struct{})
	t.Cleanup(func() {
		p.letProceed()
		select {
		case <-shutdownDone:
		case <-time.After(30 * time.Second):
			t.Error("Shutdown did not return")
		}
	})
	require.NoError(t, q.enq.Enqueue(t.Context(), "cut-job", jobs.PriorityNormal, time.Time{}))
	wait := func(ch <-chan struct{}, what string) {
		t.Helper()
		select {
		case <-ch:
		case <-time.After(30 * time.Second):
			t.Fatalf("%s did not happen within 30s", what)
		}
	}
	wait(p.started, "the delivery")

	go func() {
		defer close(shutdownDone)
		srv.Shutdown()
	}()
	wait(p.cut, "the cut")
	deadline := time.After(30 * time.Second)
	for waiting := false; !waiting; {
		select {
		case msg := <-logs:
			waiting = msg == "waiting for the deliveries cut by the shutdown to record their attempts"
		case <-shutdownDone:
			t.Fatal("Shutdown returned while the delivery it cut was still recording its attempt")
		case <-deadline:
			t.Fatal("Shutdown neither returned nor waited for the delivery it cut within 30s")
		}
	}
	p.letProceed()
	wait(shutdownDone, "Shutdown's return")
	require.True(t, p.recorded.Load(), "Shutdown returned before the cut delivery")

	// The cut delivery's task is back in the queue for another worker.
	insp := asynq.NewInspector(q.opt)
	defer insp.Close()
	info, err := insp.GetTaskInfo(dispatch.NewQueues(q.name).For(jobs.PriorityNormal), "cut-job")
	require.NoError(t, err)
	require.Equal(t, asynq.TaskStatePending, info.State)
}
