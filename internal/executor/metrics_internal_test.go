package executor

import (
	"math"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/jobs"
)

// finiteBucketCount returns how many observations of metric name (its only series) lie in its
// highest finite bucket: those above it are in +Inf alone, where histogram_quantile can only
// answer that bucket's bound.
func finiteBucketCount(t *testing.T, reg *prometheus.Registry, name string) uint64 {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			h := m.GetHistogram()
			if h.GetSampleCount() == 0 {
				continue
			}
			bs := h.GetBucket()
			last := bs[len(bs)-1]
			require.False(t, math.IsInf(last.GetUpperBound(), 1))
			return last.GetCumulativeCount()
		}
	}
	t.Fatalf("no observation of %s", name)
	return 0
}

// TestMetrics_BucketsHoldTheLongestValues: a job may live up to its longest timeout (24h) from
// its submit to its end, and a provider call up to attempt_timeout (5m by default): each lands in
// a finite bucket, so that a quantile of them is their own and not the top bucket's bound (a
// backlog's p95 of three hours read as 27 minutes, a five-minute call as 65 s).
func TestMetrics_BucketsHoldTheLongestValues(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	m := NewMetrics(reg)
	m.Finished("default", jobs.StatusFailed, "", 24*time.Hour)
	require.EqualValues(t, 1, finiteBucketCount(t, reg, "llmq_job_duration_seconds"), "a job that lived its 24h timeout")

	reg = prometheus.NewRegistry()
	m = NewMetrics(reg)
	m.stage(StageCall, 5*time.Minute)
	require.EqualValues(t, 1, finiteBucketCount(t, reg, "llmq_delivery_stage_duration_seconds"), "a call of the default attempt_timeout")
}
