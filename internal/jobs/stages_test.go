package jobs_test

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/jobs"
	"github.com/llmq/llmq/internal/llm"
	"github.com/llmq/llmq/internal/llmsim"
	"github.com/llmq/llmq/internal/redistest"
)

// stageCounts returns how many observations llmq_delivery_stage_duration_seconds holds per stage.
func stageCounts(t *testing.T, reg *prometheus.Registry) map[string]uint64 {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	out := map[string]uint64{}
	for _, mf := range mfs {
		if mf.GetName() != "llmq_delivery_stage_duration_seconds" {
			continue
		}
		for _, m := range mf.GetMetric() {
			out[m.GetLabel()[0].GetValue()] = m.GetHistogram().GetSampleCount()
		}
	}
	return out
}

// A delivery records the time it spent in each stage it ran, so an operator can see where a job's
// latency goes; the pick-up (creation to first delivery) is recorded once per job.
func TestHandler_RecordsTheStagesOfADelivery(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := setupStore(t)
	rdb := redistest.Client(t)
	lim, brk := sharedAdmission(t, rdb)
	p := simProvider(t, llmsim.Config{}, "sk-stages")
	reg := prometheus.NewRegistry()
	h := jobs.NewHandler(jobs.HandlerConfig{Store: b.store, Metrics: jobs.NewMetrics(reg), Credentials: map[string]jobs.Credential{
		"default": {Name: "default", Kind: string(llm.KindAnthropic), Provider: p,
			Limiter: lim.Credential("sk-stages", "default"), Breaker: brk.Credential("sk-stages", "default")},
		"backup": {Name: "backup", Kind: string(llm.KindAnthropic), Provider: p,
			Limiter: lim.Credential("sk-backup", "backup"), Breaker: brk.Credential("sk-backup", "backup")},
	}})
	job, _, err := b.store.Create(ctx, jobs.CreateParams{Tenant: "default", Credential: "default",
		Request: helloRequest, MaxAttempts: 3, Timeout: time.Minute})
	require.NoError(t, err)

	// When the job's first delivery runs it to success
	require.NoError(t, h.Process(ctx, job.ID))

	// Then every stage was recorded once
	require.Equal(t, map[string]uint64{
		jobs.StagePickup: 1, jobs.StageLoad: 1, jobs.StageBreaker: 1, jobs.StageAdmit: 1,
		jobs.StageBegin: 1, jobs.StageCall: 1, jobs.StageBookkeeping: 1, jobs.StageRecord: 1,
	}, stageCounts(t, reg))

	// When a duplicate delivery finds the job finished, it records only its read, and no second
	// pick-up
	require.NoError(t, h.Process(ctx, job.ID))
	got := stageCounts(t, reg)
	require.Equal(t, uint64(2), got[jobs.StageLoad])
	require.Equal(t, uint64(1), got[jobs.StagePickup])
	require.Equal(t, uint64(1), got[jobs.StageCall])

	// When a job's first delivery fails over (its credential is paused) and runs on the fallback
	_, err = lim.Credential("sk-stages", "default").Pause(ctx, "spend_cap", "")
	require.NoError(t, err)
	moved, _, err := b.store.Create(ctx, jobs.CreateParams{Tenant: "default", Credential: "default", Fallbacks: []string{"backup"},
		Request: helloRequest, MaxAttempts: 3, Timeout: time.Minute})
	require.NoError(t, err)
	require.NoError(t, h.Process(ctx, moved.ID))
	done, err := b.store.Get(ctx, moved.ID)
	require.NoError(t, err)
	require.Equal(t, jobs.StatusSucceeded, done.Status)
	require.Equal(t, "backup", *done.AnsweredBy)

	// Then its pick-up is recorded once, though the delivery read the job on each credential
	got = stageCounts(t, reg)
	require.Equal(t, uint64(2), got[jobs.StagePickup])
	require.Equal(t, uint64(4), got[jobs.StageLoad])
}
