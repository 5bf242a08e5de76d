package executor_test

import (
	"context"
	"encoding/json"
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

// A cancel that lands after the provider answered (the answer on its way back, the result not
// yet stored) stores no result, but the provider charged for the answer: its usage is kept, on
// the attempt (ctl jobs show, the console) and as the canceled job's usage (what its tenant
// reads of what the job cost). It was dropped: the canceled job read usage null.
func TestExecutor_CanceledAfterTheAnswerKeepsItsUsage(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := jobstest.New(t)
	p := &cancelAtAnswer{Provider: simProvider(t, llmsim.Config{Capacity: 100, RefillPerSecond: 100}, "sk-late-cancel"), store: b.Store}
	ex := executor.New(executor.Config{Store: b.Store, Upstreams: map[string]executor.Upstream{
		"default": {Name: "default", Kind: string(llm.KindAnthropic), Provider: p},
	}})
	job, _, err := b.Store.Create(ctx, jobs.CreateParams{Tenant: "default", Credential: "default",
		Request: helloRequest, MaxAttempts: 3, Timeout: time.Minute})
	require.NoError(t, err)
	p.job = job.ID

	require.NoError(t, ex.Process(ctx, dispatch.Delivery{JobID: job.ID}))
	require.NoError(t, p.cancelErr)

	got, err := b.Store.Get(ctx, job.ID)
	require.NoError(t, err)
	require.Equal(t, jobs.StatusCanceled, got.Status)
	require.Nil(t, got.Result, "a canceled job stores no result")
	require.NotNil(t, got.Usage, "the answer's usage was dropped")
	var usage llm.Usage
	require.NoError(t, json.Unmarshal(got.Usage, &usage))
	require.Equal(t, p.usage, usage)
	require.Positive(t, usage.OutputTokens)
	require.Equal(t, []jobs.Status{"queued", "running", "canceled"}, b.Events(t, job.ID), "no transition after the cancel")

	attempts, err := b.Store.Attempts(ctx, job.ID)
	require.NoError(t, err)
	require.Len(t, attempts, 1)
	require.JSONEq(t, string(got.Usage), string(attempts[0].Usage), "the attempt holds what the provider counted")
}

// cancelAtAnswer is a provider whose answer returns only once job is canceled in Postgres: the
// cancel lands between the provider's answer and its record.
type cancelAtAnswer struct {
	llm.Provider
	store     *jobs.Store
	job       string
	usage     llm.Usage
	cancelErr error
}

func (p *cancelAtAnswer) Send(ctx context.Context, body []byte, opts llm.SendOptions) (*llm.Response, error) {
	r, err := p.Provider.Send(ctx, body, opts)
	if err == nil {
		p.usage = r.Usage
		_, p.cancelErr = p.store.Cancel(context.WithoutCancel(ctx), p.job)
	}
	return r, err
}
