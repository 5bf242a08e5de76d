package executor_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/dispatch"
	"github.com/llmq/llmq/internal/executor"
	"github.com/llmq/llmq/internal/jobs"
	"github.com/llmq/llmq/internal/jobstest"
	"github.com/llmq/llmq/internal/llm"
	"github.com/llmq/llmq/internal/llmsim"
)

// TestExecutor_FailOverOfAJobAnotherDeliveryMovedSkipsNoFallback: two deliveries of one job at
// once (an asynq redelivery beside a rescue task) both read it on a credential that cannot take
// it, and the other one moves it to its first fallback first. This delivery's failover, from a
// credential the job has left, moves nothing: the job is not moved past its first fallback to
// its second, nor is the left credential's recheck written over the row the other delivery now
// runs. That delivery's own run answers it on the first fallback.
func TestExecutor_FailOverOfAJobAnotherDeliveryMovedSkipsNoFallback(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := jobstest.New(t)
	// Given a job on "gone" (no longer configured) with fallbacks "backup" and "spare",
	stale, _, err := b.Store.Create(ctx, jobs.CreateParams{Tenant: "default", Credential: "gone",
		Fallbacks: []string{"backup", "spare"}, Request: helloRequest, MaxAttempts: 3, Timeout: time.Hour})
	require.NoError(t, err)
	upstream := func(name string) executor.Upstream {
		return executor.Upstream{Name: name, Kind: string(llm.KindAnthropic),
			Provider: simProvider(t, llmsim.Config{}, "sk-"+name)}
	}
	ex := executor.New(executor.Config{Store: b.Store, Upstreams: map[string]executor.Upstream{
		"backup": upstream("backup"), "spare": upstream("spare")}})
	// which another delivery has moved on to "backup" since this one read it,
	applied, err := b.Store.Finish(ctx, stale.ID, nil, jobs.Outcome{Status: jobs.StatusQueued, NextCredential: true})
	require.NoError(t, err)
	require.True(t, applied)

	// when this delivery fails it over from "gone",
	perr := ex.ProcessFresh(ctx, stale, nil)
	var deferred *dispatch.DeferError
	require.ErrorAs(t, perr, &deferred, "this delivery ran the job")
	// then the job is still on "backup", due at once,
	got, err := b.Store.Get(ctx, stale.ID)
	require.NoError(t, err)
	require.Equal(t, jobs.StatusQueued, got.Status, "last error: %+v", got.LastError)
	require.Equal(t, 1, got.CredentialIndex, "the job skipped its first fallback")
	require.Nil(t, got.NextAttemptAt, "the left credential's recheck was written over the row")

	// and the other delivery's run answers it there.
	require.NoError(t, ex.Process(ctx, dispatch.Delivery{JobID: stale.ID}))
	got, err = b.Store.Get(ctx, stale.ID)
	require.NoError(t, err)
	require.Equal(t, jobs.StatusSucceeded, got.Status, "last error: %+v", got.LastError)
	require.Equal(t, "backup", *got.AnsweredBy)
}
