package executor_test

import (
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/breaker"
	"github.com/llmq/llmq/internal/dispatch"
	"github.com/llmq/llmq/internal/estimator"
	"github.com/llmq/llmq/internal/executor"
	"github.com/llmq/llmq/internal/jobs"
	"github.com/llmq/llmq/internal/jobstest"
	"github.com/llmq/llmq/internal/limiter"
	"github.com/llmq/llmq/internal/llm"
	"github.com/llmq/llmq/internal/llmsim"
	"github.com/llmq/llmq/internal/logtest"
	"github.com/llmq/llmq/internal/redistest"
)

// tooSmall is a credential's limit that helloRequest's 16 output tokens can never fit;
// largeEnough one they fit.
var (
	tooSmall    = limiter.Limit{Rate: 100, Burst: 10, OutputTokensPerMinute: 8}
	largeEnough = limiter.Limit{Rate: 100, Burst: 10, OutputTokensPerMinute: 1000}
)

// limitedUpstream returns a maker of upstreams named name, each on its own llmsim, key, gate and
// breaker, with the limit given.
func limitedUpstream(t *testing.T, lim *limiter.Limiter, brk *breaker.Breaker) func(name string, limit limiter.Limit) executor.Upstream {
	t.Helper()
	return func(name string, limit limiter.Limit) executor.Upstream {
		return executor.Upstream{Name: name, Kind: string(llm.KindAnthropic),
			Provider: simProvider(t, llmsim.Config{}, "sk-"+name), Gate: lim.Gate("sk-"+name, name),
			Circuit: brk.Circuit("sk-"+name, name), Limit: limit}
	}
}

// TestExecutor_TooLargeForItsCredentialFailsOver: a request that can never fit its credential's
// token limits (helloRequest's 16 output tokens, over a configured 8 a minute) goes to the job's
// next fallback, whose limits may be larger, rather than failing the job (it failed with a
// fallback able to take it). Nothing was sent on the small credential: its breaker counts
// nothing and holds no cold-start slot of it. Without a fallback left, the job fails unsent as
// before.
func TestExecutor_TooLargeForItsCredentialFailsOver(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := jobstest.New(t)
	rdb := redistest.Client(t)
	lim, brk := sharedAdmission(t, rdb)
	est, err := estimator.New(nil)
	require.NoError(t, err)
	upstream := limitedUpstream(t, lim, brk)
	// Each subtest has credentials of its own: a breaker's cold-start slot of the other's job
	// would be counted in the other's.
	ups := map[string]executor.Upstream{"small": upstream("small", tooSmall),
		"smaller": upstream("smaller", tooSmall), "large": upstream("large", largeEnough),
		"tiny": upstream("tiny", tooSmall), "tinier": upstream("tinier", tooSmall)}
	ex := executor.New(executor.Config{Store: b.Store, Estimator: est, Upstreams: ups})
	// untouched requires that the breakers of names count nothing of the jobs that left them.
	untouched := func(t *testing.T, names ...string) {
		t.Helper()
		for _, name := range names {
			st, err := ups[name].Circuit.Status(ctx)
			require.NoError(t, err)
			require.Equal(t, breaker.Closed, st.State, name)
			require.Zero(t, st.Failures, name)
			require.Zero(t, st.InFlight, "%s: a cold-start slot was kept", name)
		}
	}

	t.Run("Fallback", func(t *testing.T) {
		t.Parallel()
		// Given a job on "small" with fallbacks "smaller" (too small too) and "large",
		job, _, err := b.Store.Create(ctx, jobs.CreateParams{Tenant: "default", Credential: "small",
			Fallbacks: []string{"smaller", "large"}, Request: helloRequest, MaxAttempts: 1,
			Timeout: time.Hour})
		require.NoError(t, err)
		// when it is delivered,
		require.NoError(t, ex.Process(ctx, dispatch.Delivery{JobID: job.ID}))
		// then "large" answers it, in its one attempt,
		got, err := b.Store.Get(ctx, job.ID)
		require.NoError(t, err)
		require.Equal(t, jobs.StatusSucceeded, got.Status, "last error: %+v", got.LastError)
		require.Equal(t, "large", *got.AnsweredBy)
		require.Equal(t, 1, got.Attempts, "a credential too small counted an attempt")
		// and the credentials it left count nothing of it.
		untouched(t, "small", "smaller")
	})
	t.Run("NoFallback", func(t *testing.T) {
		t.Parallel()
		// Given a job on "tiny" whose only fallback, "tinier", is too small too,
		job, _, err := b.Store.Create(ctx, jobs.CreateParams{Tenant: "default", Credential: "tiny",
			Fallbacks: []string{"tinier"}, Request: helloRequest, MaxAttempts: 1,
			Timeout: time.Hour})
		require.NoError(t, err)
		// when it is delivered,
		require.NoError(t, ex.Process(ctx, dispatch.Delivery{JobID: job.ID}))
		// then it fails unsent, on the last credential it tried.
		got, err := b.Store.Get(ctx, job.ID)
		require.NoError(t, err)
		require.Equal(t, jobs.StatusFailed, got.Status)
		require.Contains(t, got.LastError.Message, "request can never be sent")
		require.Zero(t, got.Attempts)
		require.Equal(t, "tinier", got.CurrentCredential())
		untouched(t, "tiny", "tinier")
	})
}

// TestExecutor_TooLargeForSeveralCredentialsMovesOnceEach: a job whose chain holds several
// credentials too small for its request passes through them in one delivery, one move each (a
// move advances the chain, so the delivery is bounded by its length), and is answered by the
// first that fits. The delivery logs its moves in one line naming the credentials it left, not
// a line per credential (a flood of such jobs would log the chain's length in lines per job).
func TestExecutor_TooLargeForSeveralCredentialsMovesOnceEach(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := jobstest.New(t)
	lim, brk := sharedAdmission(t, redistest.Client(t))
	est, err := estimator.New(nil)
	require.NoError(t, err)
	upstream := limitedUpstream(t, lim, brk)
	var logs logtest.Buffer
	// "d" notes what the log held when the call reached it: the moves are logged before the
	// call, not after it (a call lasts minutes, and a worker that dies during it would never
	// log a move that happened).
	atCall := make(chan string, 1)
	sim := llmsim.New(llmsim.Config{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case atCall <- logs.String():
		default:
		}
		sim.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	d := upstream("d", largeEnough)
	d.Provider, err = llm.New(llm.Config{Kind: llm.KindAnthropic, BaseURL: srv.URL, APIKey: "sk-d"})
	require.NoError(t, err)
	ex := executor.New(executor.Config{Store: b.Store, Estimator: est,
		Logger: slog.New(slog.NewTextHandler(&logs, nil)), Upstreams: map[string]executor.Upstream{
			"a": upstream("a", tooSmall), "b": upstream("b", tooSmall), "c": upstream("c", tooSmall),
			"d": d}})
	// Given a job on "a" whose fallbacks "b" and "c" are too small too, and "d" fits,
	job, _, err := b.Store.Create(ctx, jobs.CreateParams{Tenant: "default", Credential: "a",
		Fallbacks: []string{"b", "c", "d"}, Request: helloRequest, MaxAttempts: 1, Timeout: time.Hour})
	require.NoError(t, err)
	// when it is delivered once,
	require.NoError(t, ex.Process(ctx, dispatch.Delivery{JobID: job.ID}))
	// then "d" answers it in its one attempt,
	got, err := b.Store.Get(ctx, job.ID)
	require.NoError(t, err)
	require.Equal(t, jobs.StatusSucceeded, got.Status, "last error: %+v", got.LastError)
	require.Equal(t, "d", *got.AnsweredBy)
	require.Equal(t, 3, got.CredentialIndex)
	require.Equal(t, 1, got.Attempts)
	// and the delivery logged its three moves in one line, before its call.
	require.Equal(t, 1, logs.Count("msg=\"failing over\""), "logs: %s", logs.String())
	require.Contains(t, logs.String(), "left=a,b,c moves=3")
	select {
	case seen := <-atCall:
		require.Contains(t, seen, "left=a,b,c moves=3", "the moves were not logged before the call")
	default:
		require.Fail(t, "no call reached d")
	}
}
