package executor

import (
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/jobs"
	"github.com/llmq/llmq/internal/retrypolicy"
)

// TestMetrics_SeriesKeptPerCredential: the series kept per configured credential record what the
// vectors' lookups record, a credential not configured is counted all the same, and no histogram
// series appears before its first observation (the series a process exports are unchanged).
func TestMetrics_SeriesKeptPerCredential(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	m := NewMetrics(reg)
	m.initCredentials([]string{"main"})
	series := func() int {
		n, err := testutil.GatherAndCount(reg)
		require.NoError(t, err)
		return n
	}
	initial := series()
	require.Equal(t, 9+3+len(jobs.DeadReasons())+1, initial, "attempts by class, outcomes, dead letters, deferrals")

	for _, cred := range []string{"main", "gone"} { // gone: a job's credential no longer configured
		m.attempt(cred, string(retrypolicy.ClassOK), 2*time.Second)
		m.attempt(cred, string(retrypolicy.ClassOK), time.Second)
		m.attempt(cred, "unheard-of", time.Second)
		m.Finished(cred, jobs.StatusSucceeded, "", 3*time.Second)
		m.Finished(cred, jobs.StatusDead, jobs.ReasonRetriesExhausted, time.Minute)
		m.Finished(cred, jobs.StatusCanceled, "", time.Second)
		require.InDelta(t, 2, testutil.ToFloat64(m.attempts.WithLabelValues(cred, string(retrypolicy.ClassOK))), 0, cred)
		require.InDelta(t, 1, testutil.ToFloat64(m.attempts.WithLabelValues(cred, "unheard-of")), 0, cred)
		require.InDelta(t, 1, testutil.ToFloat64(m.outcomes.WithLabelValues(cred, string(jobs.StatusSucceeded))), 0, cred)
		require.InDelta(t, 1, testutil.ToFloat64(m.outcomes.WithLabelValues(cred, string(jobs.StatusDead))), 0, cred)
		require.InDelta(t, 1, testutil.ToFloat64(m.outcomes.WithLabelValues(cred, string(jobs.StatusCanceled))), 0, cred)
		require.InDelta(t, 1, testutil.ToFloat64(m.deadLetters.WithLabelValues(cred, jobs.ReasonRetriesExhausted)), 0, cred)
	}
	m.stage(StageCall, time.Second)
	m.stage(StageCall, time.Second)
	m.stage("elsewhere", time.Second)

	counts := map[string]uint64{}
	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		for _, s := range mf.GetMetric() {
			if h := s.GetHistogram(); h != nil {
				key := mf.GetName()
				for _, l := range s.GetLabel() {
					key += "," + l.GetValue()
				}
				counts[key] = h.GetSampleCount()
			}
		}
	}
	require.Equal(t, map[string]uint64{
		"llmq_attempt_duration_seconds,main":             3,
		"llmq_attempt_duration_seconds,gone":             3,
		"llmq_job_duration_seconds,main,succeeded":       1,
		"llmq_job_duration_seconds,main,dead":            1,
		"llmq_job_duration_seconds,main,canceled":        1,
		"llmq_job_duration_seconds,gone,succeeded":       1,
		"llmq_job_duration_seconds,gone,dead":            1,
		"llmq_job_duration_seconds,gone,canceled":        1,
		"llmq_delivery_stage_duration_seconds,call":      2,
		"llmq_delivery_stage_duration_seconds,elsewhere": 1,
	}, counts)
	// main's other counters were there from the start; gone's appeared as they were counted.
	require.Equal(t, initial+len(counts)+2+6, series(), "main: unheard-of, canceled; gone: two attempts, three outcomes, a dead letter")
	require.Nil(t, m.series("gone"), "an unconfigured credential is not kept")
}

// TestMetrics_ConfiguredCredentialLookedUpOnce: a job of a configured credential does not look
// its series up in the vectors again (the lookups were ~1% of a job's CPU): a series taken out of
// its vector behind the metrics' back is not made again by the next job, as a lookup would make
// it. (No vector of the executor's is ever pruned; this only shows where the series come from.)
// A credential not configured is still looked up each time.
func TestMetrics_ConfiguredCredentialLookedUpOnce(t *testing.T) {
	t.Parallel()
	m := NewMetrics(prometheus.NewRegistry())
	m.initCredentials([]string{"main"})
	job := func(cred string) {
		m.stage(StageCall, time.Second)
		m.attempt(cred, string(retrypolicy.ClassOK), time.Second)
		m.Finished(cred, jobs.StatusSucceeded, "", time.Second)
	}
	for _, cred := range []string{"main", "gone"} {
		job(cred)
	}
	for _, cred := range []string{"main", "gone"} {
		require.True(t, m.attempts.DeleteLabelValues(cred, string(retrypolicy.ClassOK)), cred)
		require.True(t, m.attemptLatency.DeleteLabelValues(cred), cred)
		require.True(t, m.outcomes.DeleteLabelValues(cred, string(jobs.StatusSucceeded)), cred)
		require.True(t, m.submitToResult.DeleteLabelValues(cred, string(jobs.StatusSucceeded)), cred)
	}
	require.True(t, m.stages.DeleteLabelValues(StageCall))
	for _, cred := range []string{"main", "gone"} {
		job(cred)
	}
	remade := func(cred string) []bool {
		return []bool{m.attempts.DeleteLabelValues(cred, string(retrypolicy.ClassOK)), m.attemptLatency.DeleteLabelValues(cred),
			m.outcomes.DeleteLabelValues(cred, string(jobs.StatusSucceeded)),
			m.submitToResult.DeleteLabelValues(cred, string(jobs.StatusSucceeded))}
	}
	require.Equal(t, []bool{false, false, false, false}, remade("main"), "main's series looked up again by a job")
	require.False(t, m.stages.DeleteLabelValues(StageCall), "the call stage's series looked up again")
	require.Equal(t, []bool{true, true, true, true}, remade("gone"), "a credential not configured is looked up")
}

// TestMetrics_SeriesConcurrentFirstUse: jobs that use a credential's and a stage's series for
// the first time at once make each once and lose no count (run under -race).
func TestMetrics_SeriesConcurrentFirstUse(t *testing.T) {
	t.Parallel()
	m := NewMetrics(prometheus.NewRegistry())
	m.initCredentials([]string{"main"})
	const n, each = 8, 50
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			for range each {
				m.stage(StageCall, time.Millisecond)
				m.attempt("main", string(retrypolicy.ClassOK), time.Millisecond)
				m.Finished("main", jobs.StatusSucceeded, "", time.Millisecond)
			}
		})
	}
	wg.Wait()
	require.InDelta(t, n*each, testutil.ToFloat64(m.attempts.WithLabelValues("main", string(retrypolicy.ClassOK))), 0)
	require.InDelta(t, n*each, testutil.ToFloat64(m.outcomes.WithLabelValues("main", string(jobs.StatusSucceeded))), 0)
	require.Equal(t, 3, testutil.CollectAndCount(m.stages)+testutil.CollectAndCount(m.attemptLatency)+
		testutil.CollectAndCount(m.submitToResult), "one series each")
}
