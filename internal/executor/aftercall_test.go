package executor_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/dispatch"
	"github.com/llmq/llmq/internal/estimator"
	"github.com/llmq/llmq/internal/executor"
	"github.com/llmq/llmq/internal/jobs"
	"github.com/llmq/llmq/internal/jobstest"
	"github.com/llmq/llmq/internal/limiter"
	"github.com/llmq/llmq/internal/llm"
	"github.com/llmq/llmq/internal/llmsim"
	"github.com/llmq/llmq/internal/redistest"
	"github.com/llmq/llmq/internal/retrypolicy"
	"github.com/llmq/llmq/internal/tokens"
)

// After a call, what the limiter learns (limit, token buckets, the reconciled grant) and what the
// breaker hears go to Redis in one round trip, not one per script. The round trips are counted
// from the provider's answer: before it, admission may ask the limiter more than once (a slot
// refused for a few milliseconds is asked for again in process) or report a burst slot's send.
func TestExecutor_AfterCallBookkeepingInOneRoundTrip(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := jobstest.New(t)
	rdb := redistest.Client(t)
	trips := &redistest.ScriptTrips{}
	rdb.AddHook(trips)
	lim, brk := sharedAdmission(t, rdb)
	p := simProvider(t, llmsim.Config{Capacity: 100, RefillPerSecond: 100,
		InputTokensPerMinute: 1_000_000, OutputTokensPerMinute: 1_000_000}, "sk-aftercall")
	est, err := estimator.New(nil)
	require.NoError(t, err)
	lc, bc := lim.Gate("sk-aftercall", "default"), brk.Circuit("sk-aftercall", "default")
	answered := &tripsAtAnswer{Provider: p, trips: trips}
	ex := executor.New(executor.Config{Store: b.Store, Estimator: est, Upstreams: map[string]executor.Upstream{
		"default": {Name: "default", Kind: string(llm.KindAnthropic), Provider: answered, Gate: lc, Circuit: bc},
	}})
	run := func() {
		t.Helper()
		job, _, err := b.Store.Create(ctx, jobs.CreateParams{Tenant: "default", Credential: "default",
			Request: helloRequest, MaxAttempts: 3, Timeout: time.Minute})
		require.NoError(t, err)
		require.NoError(t, ex.Process(ctx, dispatch.Delivery{JobID: job.ID}))
		got, err := b.Store.Get(ctx, job.ID)
		require.NoError(t, err)
		require.Equal(t, jobs.StatusSucceeded, got.Status)
	}

	run() // learns the request and token limits from the headers
	_, src, err := lc.Current(ctx)
	require.NoError(t, err)
	require.Equal(t, limiter.SourceLearned, src, "the limiter heard the first answer")
	tl, err := lc.CurrentTokenBuckets(ctx)
	require.NoError(t, err)
	require.Equal(t, limiter.SourceLearned, tl.Input.Source, "the token buckets were learned from it")
	st, err := bc.Status(ctx)
	require.NoError(t, err)
	require.False(t, st.Capped, "the breaker heard the success (it lifts the cold-start cap)")

	// The first run with tokens reserved is the first to reconcile a grant: on a Redis whose
	// script cache lacks that script (a fresh server, a flush), its EVALSHA is answered NOSCRIPT
	// and sent again as EVAL, a second round trip. Counted is the run after it.
	run()
	before := trips.Count()
	run() // reserves tokens: its bookkeeping observes, learns tokens, reconciles and reports
	at := int(answered.at.Load())
	require.GreaterOrEqual(t, at-before, 1, "the limiter's reservation (with the breaker's test) before the call")
	require.Equal(t, 1, trips.Count()-at, "one round trip of bookkeeping after the call")
}

// tripsAtAnswer is a provider that notes the script round trips counted when its answer returns.
type tripsAtAnswer struct {
	llm.Provider
	trips *redistest.ScriptTrips
	at    atomic.Int64
}

func (p *tripsAtAnswer) Send(ctx context.Context, body []byte, opts llm.SendOptions) (*llm.Response, error) {
	r, err := p.Provider.Send(ctx, body, opts)
	p.at.Store(int64(p.trips.Count()))
	return r, err
}

// An answer's result is stored without waiting for the bookkeeping after the call: the two go
// to Postgres and Redis side by side, and the delivery ends when both are done. Here the
// bookkeeping's round trip is held until the job reads as succeeded in Postgres (it would wait
// out its deadline if the result were recorded after it).
func TestExecutor_ResultIsNotHeldBackByTheBookkeeping(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := jobstest.New(t)
	rdb := redistest.Client(t)
	hold := &holdBookkeeping{store: b.Store}
	rdb.AddHook(hold)
	lim, brk := sharedAdmission(t, rdb)
	p := simProvider(t, llmsim.Config{Capacity: 100, RefillPerSecond: 100}, "sk-side-by-side")
	lc := lim.Gate("sk-side-by-side", "default")
	ex := executor.New(executor.Config{Store: b.Store, Upstreams: map[string]executor.Upstream{
		"default": {Name: "default", Kind: string(llm.KindAnthropic), Provider: p, Gate: lc,
			Circuit: brk.Circuit("sk-side-by-side", "default")},
	}})
	job, _, err := b.Store.Create(ctx, jobs.CreateParams{Tenant: "default", Credential: "default",
		Request: helloRequest, MaxAttempts: 3, Timeout: time.Minute})
	require.NoError(t, err)
	hold.job.Store(&job.ID)

	require.NoError(t, ex.Process(ctx, dispatch.Delivery{JobID: job.ID}))

	require.Equal(t, int64(1), hold.held.Load(), "the bookkeeping's round trip was held once")
	require.Zero(t, hold.timedOut.Load(), "the result was stored while the bookkeeping waited")
	// And the bookkeeping was done by the time the delivery ended
	_, src, err := lc.Current(ctx)
	require.NoError(t, err)
	require.Equal(t, limiter.SourceLearned, src, "the limiter heard the answer")
}

// holdBookkeeping holds every pipeline of scripts (the after-call bookkeeping is the only one in
// a delivery) until job reads as succeeded, for at most 30 s.
type holdBookkeeping struct {
	store    *jobs.Store
	job      atomic.Pointer[string]
	held     atomic.Int64
	timedOut atomic.Int64
}

func (h *holdBookkeeping) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *holdBookkeeping) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }

func (h *holdBookkeeping) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		id := h.job.Load()
		if id == nil || len(cmds) < 2 || (cmds[0].Name() != "evalsha" && cmds[0].Name() != "eval") {
			return next(ctx, cmds)
		}
		h.held.Add(1)
		deadline := time.Now().Add(30 * time.Second)
		for {
			j, err := h.store.Get(ctx, *id)
			if err == nil && j.Status == jobs.StatusSucceeded {
				break
			}
			if time.Now().After(deadline) {
				h.timedOut.Add(1)
				break
			}
			time.Sleep(5 * time.Millisecond)
		}
		return next(ctx, cmds)
	}
}

// An answer that reports no usage keeps its grant's tokens charged: the provider counted
// something, and taking it as zero would refund the whole reservation and let the next requests
// overdraw the provider's token limit.
func TestExecutor_AnswerWithoutUsageKeepsItsTokens(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := jobstest.New(t)
	lim, _ := sharedAdmission(t, redistest.Client(t))
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"id":"msg_1","type":"message","role":"assistant","model":"claude-test",`+
			`"content":[{"type":"text","text":"ok"}],"stop_reason":"end_turn"}`)
	}))
	t.Cleanup(srv.Close)
	p, err := llm.New(llm.Config{Kind: llm.KindAnthropic, BaseURL: srv.URL, APIKey: "sk-usage"})
	require.NoError(t, err)
	est, err := estimator.New(nil)
	require.NoError(t, err)
	limit := limiter.Limit{Rate: 100, Burst: 1, InputTokensPerMinute: 1000}
	gate := lim.Gate("sk-usage", "usage")
	ex := executor.New(executor.Config{Store: b.Store, Policy: retrypolicy.New(nil), Estimator: est,
		Upstreams: map[string]executor.Upstream{"usage": {Name: "usage", Kind: string(llm.KindAnthropic),
			Provider: p, Gate: gate, Limit: limit}}})
	body, err := json.Marshal(map[string]any{"model": "claude-test", "max_tokens": 16,
		"messages": []any{map[string]any{"role": "user", "content": strings.Repeat("a", 2000)}}}) // ~625 tokens reserved
	require.NoError(t, err)
	_, err = gate.Reserve(ctx, limit) // the request bucket's burst taken: the job's slot is a refill's
	require.NoError(t, err)
	job, _, err := b.Store.Create(ctx, jobs.CreateParams{Tenant: "default", Credential: "usage", Request: body,
		MaxAttempts: 1, Timeout: time.Minute})
	require.NoError(t, err)
	require.NoError(t, ex.Process(ctx, dispatch.Delivery{JobID: job.ID}))
	got, err := b.Store.Get(ctx, job.ID)
	require.NoError(t, err)
	require.Equal(t, jobs.StatusSucceeded, got.Status)

	// Of the minute's 1,000 input tokens ~625 are still in use: another 625 wait for the refill.
	r, err := gate.ReserveCost(ctx, limit, tokens.Cost{InputTokens: 625})
	require.NoError(t, err)
	require.Greater(t, r.Wait, time.Second, "the answered request's tokens were refunded as if never counted")
}
