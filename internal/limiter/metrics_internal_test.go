package limiter

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/tokens"
)

// TestGateSeries_SameSeriesFewerLookups: a Gate's metric series record what the vectors' lookups
// recorded, create only the series a lookup would have (none for what did not happen), and a
// job's reservation and reconcile allocate nothing once the series are made.
func TestGateSeries_SameSeriesFewerLookups(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := NewMetrics(reg)
	g := newGateSeries(m, "main")

	// A reservation that is not granted, with no tokens: the limit series only.
	g.reserved(Reservation{Limit: Limit{Rate: 2, Burst: 3}, Source: SourceLearned})
	n, err := testutil.GatherAndCount(reg)
	require.NoError(t, err)
	require.Equal(t, 5, n, "rate, burst and three sources")
	require.InDelta(t, 2, testutil.ToFloat64(m.rate.WithLabelValues("main")), 0)
	require.InDelta(t, 1, testutil.ToFloat64(m.source.WithLabelValues("main", string(SourceLearned))), 0)
	require.InDelta(t, 0, testutil.ToFloat64(m.source.WithLabelValues("main", string(SourceUnknown))), 0)

	job := Reservation{Limit: Limit{Rate: 5, Burst: 1}, Source: SourceConfigured, Granted: true, Probe: true, Grant: 7,
		Cost:   tokens.Cost{InputTokens: 10, OutputTokens: 20},
		Tokens: TokenBuckets{Input: TokenBucket{PerMinute: 100}, Combined: TokenBucket{PerMinute: 300}}}
	g.reserved(job)
	g.reconciled(tokens.Cost{InputTokens: 9, OutputTokens: 4})
	g.pushedBack()
	g.refused()
	g.setPaused(true)
	require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP llmq_limiter_tokens_reported_total Tokens the provider reported (usage), reconciled against reserved ones.
# TYPE llmq_limiter_tokens_reported_total counter
llmq_limiter_tokens_reported_total{credential="main",kind="input"} 9
llmq_limiter_tokens_reported_total{credential="main",kind="output"} 4
# HELP llmq_limiter_tokens_reserved_total Tokens reserved before sending (estimated input, max_tokens output) for slots that charged a token bucket.
# TYPE llmq_limiter_tokens_reserved_total counter
llmq_limiter_tokens_reserved_total{credential="main",kind="input"} 10
llmq_limiter_tokens_reserved_total{credential="main",kind="output"} 20
# HELP llmq_limiter_limit_tokens_per_minute Token bucket capacity (tokens per minute) the limiter paces the credential at, per bucket (0 while unknown).
# TYPE llmq_limiter_limit_tokens_per_minute gauge
llmq_limiter_limit_tokens_per_minute{bucket="input_tokens",credential="main"} 100
llmq_limiter_limit_tokens_per_minute{bucket="output_tokens",credential="main"} 0
llmq_limiter_limit_tokens_per_minute{bucket="tokens",credential="main"} 300
# HELP llmq_limiter_limit_source 1 for where the credential's limit comes from: configured, learned or unknown.
# TYPE llmq_limiter_limit_source gauge
llmq_limiter_limit_source{credential="main",source="configured"} 1
llmq_limiter_limit_source{credential="main",source="learned"} 0
llmq_limiter_limit_source{credential="main",source="unknown"} 0
# HELP llmq_limiter_probes_total Requests let out alone to learn an unknown limit.
# TYPE llmq_limiter_probes_total counter
llmq_limiter_probes_total{credential="main"} 1
# HELP llmq_limiter_retry_after_pushbacks_total 429 responses with Retry-After that pushed the shared schedule back.
# TYPE llmq_limiter_retry_after_pushbacks_total counter
llmq_limiter_retry_after_pushbacks_total{credential="main"} 1
# HELP llmq_retry_budget_refusals_total Retries refused (deferred) because the credential's retry budget was spent.
# TYPE llmq_retry_budget_refusals_total counter
llmq_retry_budget_refusals_total{credential="main"} 1
# HELP llmq_limiter_paused 1 while the credential is paused (a 429 without Retry-After), as last seen by this process.
# TYPE llmq_limiter_paused gauge
llmq_limiter_paused{credential="main"} 1
`), "llmq_limiter_tokens_reported_total", "llmq_limiter_tokens_reserved_total", "llmq_limiter_limit_tokens_per_minute",
		"llmq_limiter_limit_source", "llmq_limiter_probes_total", "llmq_limiter_retry_after_pushbacks_total",
		"llmq_retry_budget_refusals_total", "llmq_limiter_paused"))
	require.Equal(t, uint64(1), histogramCount(t, reg, "llmq_limiter_wait_seconds"))

	allocs := testing.AllocsPerRun(100, func() {
		g.reserved(job)
		g.reconciled(tokens.Cost{InputTokens: 9, OutputTokens: 4})
	})
	require.Zero(t, allocs, "allocations of a job's metrics")
	require.Equal(t, uint64(102), histogramCount(t, reg, "llmq_limiter_wait_seconds"))

	var none *gateSeries // a limiter without metrics
	none.reserved(job)
	none.reconciled(tokens.Cost{})
	none.pushedBack()
	none.refused()
	none.setPaused(true)
	require.Nil(t, newGateSeries(nil, "main"))
}

// histogramCount is the sample count of the histogram name, of its only series.
func histogramCount(t *testing.T, reg *prometheus.Registry, name string) uint64 {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() == name {
			require.Len(t, mf.GetMetric(), 1)
			return mf.GetMetric()[0].GetHistogram().GetSampleCount()
		}
	}
	t.Fatalf("no %s", name)
	return 0
}
