package executor_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/dispatch"
	"github.com/llmq/llmq/internal/executor"
	"github.com/llmq/llmq/internal/jobs"
	"github.com/llmq/llmq/internal/jobstest"
	"github.com/llmq/llmq/internal/llm"
	"github.com/llmq/llmq/internal/llmsim"
	"github.com/llmq/llmq/internal/retrypolicy"
)

// A stream cut partway was answered: its headers came with a 200 before the cut. Its attempt's
// row recorded status_code null (the status comes from the error's classification, and a
// transport error has none), which reads as a call the provider never answered. The row keeps
// the 200, whether the cut came after a delta (ttfb_ms set) or before any (ttfb_ms null: the
// headers came, no delta did).
func TestExecutor_CutStreamAttemptKeepsItsStatus(t *testing.T) {
	t.Parallel()
	for _, after := range []int{0, 2} {
		t.Run(fmt.Sprintf("after %d tokens", after), func(t *testing.T) {
			t.Parallel()
			ctx := t.Context()
			b := jobstest.New(t)
			sim := httptest.NewServer(llmsim.New(llmsim.Config{Faults: llmsim.Faults{StreamFailNext: 1,
				StreamFailAfter: after, StreamFailMode: llmsim.StreamFailCut}}))
			t.Cleanup(sim.Close)
			p, err := llm.New(llm.Config{Kind: llm.KindOpenAI, BaseURL: sim.URL, APIKey: "sk-openai"})
			require.NoError(t, err)
			ex := executor.New(executor.Config{Store: b.Store,
				Policy:    retrypolicy.New(&retrypolicy.Config{Float64: func() float64 { return 0 }}),
				Upstreams: map[string]executor.Upstream{"oa": {Name: "oa", Kind: string(llm.KindOpenAI), Provider: p}}})
			body := json.RawMessage(`{"model":"gpt-test","max_tokens":16,"stream":true,"messages":[{"role":"user","content":"hi"}]}`)
			job, _, err := b.Store.Create(ctx, jobs.CreateParams{Tenant: "default", Credential: "oa", Request: body,
				MaxAttempts: 2, Timeout: time.Minute})
			require.NoError(t, err)
			var de *dispatch.DeferError
			require.True(t, errors.As(ex.Process(ctx, dispatch.Delivery{JobID: job.ID}), &de), "the cut stream is retried")

			attempts, err := b.Store.Attempts(ctx, job.ID)
			require.NoError(t, err)
			require.Len(t, attempts, 1)
			require.Equal(t, string(retrypolicy.ClassNetwork), attempts[0].Class, "the cut is still the attempt's class")
			require.NotNil(t, attempts[0].StatusCode, "the row reads as a call the provider never answered")
			require.Equal(t, 200, *attempts[0].StatusCode)
			require.Equal(t, after > 0, attempts[0].TTFBMS != nil, "ttfb_ms is the time to the first delta, when one came")

			got, err := b.Store.Get(ctx, job.ID)
			require.NoError(t, err)
			require.NotNil(t, got.LastError)
			require.Zero(t, got.LastError.Status, "last_error's status is the failure's, and a cut has none")
		})
	}
}
