package dispatch_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/dispatch"
	"github.com/llmq/llmq/internal/jobs"
	"github.com/llmq/llmq/internal/jobstest"
	"github.com/llmq/llmq/internal/redistest"
	"github.com/llmq/llmq/internal/retrypolicy"
)

// byJob answers each delivery with the error its job is given (nil: none), and counts them.
type byJob struct {
	errs  map[string]error
	calls map[string]*atomic.Int32
}

func (p *byJob) Process(_ context.Context, d dispatch.Delivery) error {
	p.calls[d.JobID].Add(1)
	return p.errs[d.JobID]
}

// TestServer_CountsDeliveryErrors: a delivery that fails on the stores (a Postgres or Redis
// error the processor returns) counts in llmq_delivery_errors_total, the only trace of it: asynq
// retries it with backoff and logs nothing. Deferrals, and cancels (a job's abort, a shutdown),
// are not errors.
func TestServer_CountsDeliveryErrors(t *testing.T) {
	t.Parallel()
	b := jobstest.New(t)
	tb := setupTasks(t)
	failing, deferred, canceled := b.Create(t, jobstest.Opts{}), b.Create(t, jobstest.Opts{}), b.Create(t, jobstest.Opts{})
	p := &byJob{
		errs: map[string]error{
			failing.ID:  errors.New("load job: failed to connect to `host=127.0.0.1`: connection refused"),
			deferred.ID: &dispatch.DeferError{Until: time.Now().Add(time.Hour), Reason: "later"},
			canceled.ID: fmt.Errorf("load job: %w", context.Canceled),
		},
		calls: map[string]*atomic.Int32{failing.ID: {}, deferred.ID: {}, canceled.ID: {}},
	}
	reg := prometheus.NewRegistry()
	opt, err := dispatch.RedisConnOpt(redistest.URL())
	require.NoError(t, err)
	srv := dispatch.NewServer(opt, dispatch.ServerConfig{Queue: tb.queue, Concurrency: 1, PollInterval: 10 * time.Millisecond,
		Policy: retrypolicy.New(&retrypolicy.Config{}), Metrics: dispatch.NewMetrics(reg)})
	require.NoError(t, srv.Start(dispatch.Mux(p, tb.enqueuer)))
	t.Cleanup(srv.Shutdown)
	const name = "llmq_delivery_errors_total"
	n, err := testutil.GatherAndCount(reg, name)
	require.NoError(t, err)
	require.Equal(t, 1, n, "%s is there at 0 from the start", name)

	for _, id := range []string{failing.ID, deferred.ID, canceled.ID} {
		require.NoError(t, tb.enqueuer.Enqueue(t.Context(), id, jobs.PriorityNormal, time.Time{}))
	}
	require.Eventually(t, func() bool {
		return p.calls[failing.ID].Load() > 0 && p.calls[deferred.ID].Load() > 0 && p.calls[canceled.ID].Load() > 0
	}, 30*time.Second, 5*time.Millisecond, "every task delivered")
	srv.Shutdown() // every delivery has returned and been answered
	require.Equal(t, float64(p.calls[failing.ID].Load()), counter(t, reg, name),
		"each failed delivery, and only those")
}

// counter is the value of reg's counter name, which has no labels.
func counter(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	t.Fatalf("no metric %s", name)
	return 0
}
