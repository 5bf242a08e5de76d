package executor_test

import (
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/dispatch"
	"github.com/llmq/llmq/internal/executor"
	"github.com/llmq/llmq/internal/jobs"
	"github.com/llmq/llmq/internal/jobstest"
	"github.com/llmq/llmq/internal/limiter"
	"github.com/llmq/llmq/internal/llm"
	"github.com/llmq/llmq/internal/llmsim"
	"github.com/llmq/llmq/internal/redistest"
	"github.com/llmq/llmq/internal/retrypolicy"
)

// TestExecutor_SizeRefusal429LeavesTheRateAlone: OpenAI's 429 "Request too large for … (TPM)"
// refuses one request for its size, not the credential for its rate. It tells the limiter what
// any answer's headers tell (the limit is learned from them), but its Retry-After does not push
// the credential's shared schedule back, nor cap the learned rate: the credential's next request
// may go at once.
func TestExecutor_SizeRefusal429LeavesTheRateAlone(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := jobstest.New(t)
	lim, brk := sharedAdmission(t, redistest.Client(t))
	// Given an OpenAI credential whose whole tokens-per-minute limit (20) is below longRequest's
	// 26 tokens, and which sends request rate-limit headers and a Retry-After on its 429s,
	sim := llmsim.New(llmsim.Config{Capacity: 60, RefillPerSecond: 1, InputTokensPerMinute: 20})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Retry-After", "30")
		sim.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	p, err := llm.New(llm.Config{Kind: llm.KindOpenAI, BaseURL: srv.URL, APIKey: "sk-tpm"})
	require.NoError(t, err)
	gate := lim.Gate("sk-tpm", "tpm")
	ex := executor.New(executor.Config{Store: b.Store, Upstreams: map[string]executor.Upstream{
		"tpm": {Name: "tpm", Kind: string(llm.KindOpenAI), Provider: p, Gate: gate,
			Circuit: brk.Circuit("sk-tpm", "tpm")},
	}})
	// whose rate the limiter learned from a first answer,
	job, err := process(t, b, ex, "tpm", 3, time.Hour)
	require.NoError(t, err)
	require.Equal(t, jobs.StatusSucceeded, job.Status, "last error: %+v", job.LastError)
	before, source, err := gate.Current(ctx)
	require.NoError(t, err)
	require.Equal(t, limiter.SourceLearned, source)
	require.Positive(t, before.Rate)

	// When a job too large for it is refused with a 429 "Request too large" and Retry-After: 30,
	big, _, err := b.Store.Create(ctx, jobs.CreateParams{Tenant: "default", Credential: "tpm",
		Request: longRequest, MaxAttempts: 3, Timeout: time.Hour})
	require.NoError(t, err)
	require.NoError(t, ex.Process(ctx, dispatch.Delivery{JobID: big.ID}))
	got, err := b.Store.Get(ctx, big.ID)
	require.NoError(t, err)
	require.Equal(t, jobs.StatusFailed, got.Status)
	require.Equal(t, string(retrypolicy.ClassPermanent), got.LastError.Class)
	require.Equal(t, http.StatusTooManyRequests, got.LastError.Status)

	// Then the credential's schedule is not pushed back,
	pb, err := gate.PushBack(ctx)
	require.NoError(t, err)
	require.False(t, pb.Active(), "a refusal for size pushed the schedule back: %s", pb.Reason())
	// nor its learned rate capped (the answer's headers are learned as any answer's),
	after, source, err := gate.Current(ctx)
	require.NoError(t, err)
	require.Equal(t, limiter.SourceLearned, source)
	require.GreaterOrEqual(t, after.Rate, before.Rate, "the learned rate was lowered")
	// and the credential's next request may go at once.
	r, err := gate.Reserve(ctx, limiter.Limit{})
	require.NoError(t, err)
	require.True(t, r.Granted)
	require.Less(t, r.Wait, time.Second, "the next request waits for the refusal's Retry-After")
}
