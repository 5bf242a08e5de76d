package executor_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/deltastream"
	"github.com/llmq/llmq/internal/dispatch"
	"github.com/llmq/llmq/internal/executor"
	"github.com/llmq/llmq/internal/jobs"
	"github.com/llmq/llmq/internal/jobstest"
	"github.com/llmq/llmq/internal/llm"
	"github.com/llmq/llmq/internal/llmsim"
	"github.com/llmq/llmq/internal/redistest"
	"github.com/llmq/llmq/internal/retrypolicy"
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
func TestExecutor_RecordsTheStagesOfADelivery(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := jobstest.New(t)
	rdb := redistest.Client(t)
	lim, brk := sharedAdmission(t, rdb)
	p := simProvider(t, llmsim.Config{}, "sk-stages")
	reg := prometheus.NewRegistry()
	ex := executor.New(executor.Config{Store: b.Store, Metrics: executor.NewMetrics(reg), Upstreams: map[string]executor.Upstream{
		"default": {Name: "default", Kind: string(llm.KindAnthropic), Provider: p,
			Gate: lim.Gate("sk-stages", "default"), Circuit: brk.Circuit("sk-stages", "default")},
		"backup": {Name: "backup", Kind: string(llm.KindAnthropic), Provider: p,
			Gate: lim.Gate("sk-backup", "backup"), Circuit: brk.Circuit("sk-backup", "backup")},
	}})
	job, _, err := b.Store.Create(ctx, jobs.CreateParams{Tenant: "default", Credential: "default",
		Request: helloRequest, MaxAttempts: 3, Timeout: time.Minute})
	require.NoError(t, err)

	// When the job's first delivery runs it to success
	require.NoError(t, ex.Process(ctx, dispatch.Delivery{JobID: job.ID}))

	// Then every stage was recorded once
	require.Equal(t, map[string]uint64{
		executor.StagePickup: 1, executor.StageLoad: 1, executor.StageBreaker: 1, executor.StageAdmit: 1,
		executor.StageBegin: 1, executor.StageCall: 1, executor.StageBookkeeping: 1, executor.StageRecord: 1,
	}, stageCounts(t, reg))

	// When a duplicate delivery finds the job finished, it records only its read, and no second
	// pick-up
	require.NoError(t, ex.Process(ctx, dispatch.Delivery{JobID: job.ID}))
	got := stageCounts(t, reg)
	require.Equal(t, uint64(2), got[executor.StageLoad])
	require.Equal(t, uint64(1), got[executor.StagePickup])
	require.Equal(t, uint64(1), got[executor.StageCall])

	// When a job's first delivery fails over (its credential is paused) and runs on the fallback
	_, err = lim.Gate("sk-stages", "default").Pause(ctx, "spend_cap", "")
	require.NoError(t, err)
	moved, _, err := b.Store.Create(ctx, jobs.CreateParams{Tenant: "default", Credential: "default", Fallbacks: []string{"backup"},
		Request: helloRequest, MaxAttempts: 3, Timeout: time.Minute})
	require.NoError(t, err)
	require.NoError(t, ex.Process(ctx, dispatch.Delivery{JobID: moved.ID}))
	done, err := b.Store.Get(ctx, moved.ID)
	require.NoError(t, err)
	require.Equal(t, jobs.StatusSucceeded, done.Status)
	require.Equal(t, "backup", *done.AnsweredBy)

	// Then its pick-up is recorded once, though the delivery read the job on each credential
	got = stageCounts(t, reg)
	require.Equal(t, uint64(2), got[executor.StagePickup])
	require.Equal(t, uint64(4), got[executor.StageLoad])
}

// A delivery from asynq that is deferred (here: its credential paused, no fallback) counts in
// llmq_delivery_deferrals_total, there at 0 from the start: each is delivered again at its time
// and reads its job again, and LLMQDeliveryErrors leaves those redeliveries out of its ratio. A
// delivery run to its end does not count; nor does a deferred first delivery handed over in
// process (ProcessFresh), which reads no job either.
func TestExecutor_CountsDeferredDeliveries(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := jobstest.New(t)
	rdb := redistest.Client(t)
	lim, brk := sharedAdmission(t, rdb)
	p := simProvider(t, llmsim.Config{}, "sk-deferrals")
	reg := prometheus.NewRegistry()
	gate := lim.Gate("sk-deferrals", "default")
	ex := executor.New(executor.Config{Store: b.Store, Metrics: executor.NewMetrics(reg), Upstreams: map[string]executor.Upstream{
		"default": {Name: "default", Kind: string(llm.KindAnthropic), Provider: p, Gate: gate,
			Circuit: brk.Circuit("sk-deferrals", "default")},
	}})
	const name = "llmq_delivery_deferrals_total"
	deferrals := func() float64 {
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
	create := func() *jobs.Job {
		job, _, err := b.Store.Create(ctx, jobs.CreateParams{Tenant: "default", Credential: "default",
			Request: helloRequest, MaxAttempts: 3, Timeout: time.Minute})
		require.NoError(t, err)
		return job
	}
	require.Equal(t, float64(0), deferrals(), "0 from the start")

	require.NoError(t, ex.Process(ctx, dispatch.Delivery{JobID: create().ID}))
	require.Equal(t, float64(0), deferrals(), "a delivery run to its end")

	_, err := gate.Pause(ctx, "spend_cap", "")
	require.NoError(t, err)
	var de *dispatch.DeferError
	require.ErrorAs(t, ex.Process(ctx, dispatch.Delivery{JobID: create().ID}), &de)
	require.Equal(t, float64(1), deferrals())
	require.ErrorAs(t, ex.ProcessFresh(ctx, create(), nil), &de)
	require.Equal(t, float64(1), deferrals(), "a handed-over first delivery reads no job: not counted")
}

// An attempt's bookkeeping (what the call showed, told to the limiter and the breaker) runs once
// whatever the call came to: a failure's before its retry is decided, an answer's beside its
// record, a stream's (whose headers were observed as they came) after it; none runs twice, none
// is skipped.
func TestExecutor_BooksEachAttemptOnce(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := jobstest.New(t)
	rdb := redistest.Client(t)
	lim, brk := sharedAdmission(t, rdb)
	plain := simProvider(t, llmsim.Config{Faults: llmsim.Faults{FailNext: 1, FailNextStatus: 500}}, "sk-book")
	streamed := simProvider(t, llmsim.Config{ReplyTokens: 8, Faults: llmsim.Faults{StreamFailNext: 1, StreamFailAfter: 2}}, "sk-book-stream")
	fresh := simProvider(t, llmsim.Config{ReplyTokens: 8}, "sk-book-fresh")
	reg := prometheus.NewRegistry()
	ex := executor.New(executor.Config{Store: b.Store, Metrics: executor.NewMetrics(reg),
		Deltas: deltastream.New(deltastream.Config{Redis: rdb, Prefix: redistest.Prefix(t)}),
		Policy: retrypolicy.New(&retrypolicy.Config{BaseDelay: time.Millisecond, MaxDelay: 2 * time.Millisecond}),
		Upstreams: map[string]executor.Upstream{
			"plain": {Name: "plain", Kind: string(llm.KindAnthropic), Provider: plain,
				Gate: lim.Gate("sk-book", "plain"), Circuit: brk.Circuit("sk-book", "plain")},
			"streamed": {Name: "streamed", Kind: string(llm.KindAnthropic), Provider: streamed,
				Gate: lim.Gate("sk-book-stream", "streamed"), Circuit: brk.Circuit("sk-book-stream", "streamed")},
			"fresh": {Name: "fresh", Kind: string(llm.KindAnthropic), Provider: fresh,
				Gate: lim.Gate("sk-book-fresh", "fresh"), Circuit: brk.Circuit("sk-book-fresh", "fresh")},
		}})
	books := func() (calls, booked uint64) {
		got := stageCounts(t, reg)
		return got[executor.StageCall], got[executor.StageBookkeeping]
	}
	// A stream answered at its first try on a credential not yet known (its headers observed as
	// they came, by the stream's callback, while the bookkeeping's goroutine reads them after).
	job, _, err := b.Store.Create(ctx, jobs.CreateParams{Tenant: "default", Credential: "fresh",
		Request: streamingRequest, MaxAttempts: 3, Timeout: time.Minute})
	require.NoError(t, err)
	require.NoError(t, ex.Process(ctx, dispatch.Delivery{JobID: job.ID}))
	calls, booked := books()
	require.Equal(t, uint64(1), calls)
	require.Equal(t, uint64(1), booked, "a stream's bookkeeping")

	run := func(credential string, request json.RawMessage) {
		t.Helper()
		job, _, err := b.Store.Create(ctx, jobs.CreateParams{Tenant: "default", Credential: credential,
			Request: request, MaxAttempts: 3, Timeout: time.Minute})
		require.NoError(t, err)
		// When its first attempt fails (a 500; a stream cut after its headers)
		var deferred *dispatch.DeferError
		require.ErrorAs(t, ex.Process(ctx, dispatch.Delivery{JobID: job.ID}), &deferred, "%s: attempt 1 is retried", credential)
		calls, booked := books()
		require.Equal(t, calls, booked, "%s: a failed attempt's bookkeeping", credential)
		// When its retry is answered
		require.NoError(t, ex.Process(ctx, dispatch.Delivery{JobID: job.ID}))
		done, err := b.Store.Get(ctx, job.ID)
		require.NoError(t, err)
		require.Equal(t, jobs.StatusSucceeded, done.Status, credential)
		calls, booked = books()
		require.Equal(t, calls, booked, "%s: an answer's bookkeeping", credential)
	}
	run("plain", helloRequest)
	run("streamed", streamingRequest)
	calls, booked = books()
	require.Equal(t, uint64(5), calls)
	require.Equal(t, uint64(5), booked, "one bookkeeping an attempt")
}
