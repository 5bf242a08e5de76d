package executor_test

import (
	"context"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/breaker"
	"github.com/llmq/llmq/internal/executor"
	"github.com/llmq/llmq/internal/jobs"
	"github.com/llmq/llmq/internal/jobstest"
	"github.com/llmq/llmq/internal/limiter"
	"github.com/llmq/llmq/internal/llm"
	"github.com/llmq/llmq/internal/llmsim"
	"github.com/llmq/llmq/internal/redistest"
)

// A job on a credential whose breaker is closed and has heard a success makes no round trip of
// the breaker's own before its call: the breaker's test rides in the reservation's script. The
// admission it gives is a real one: failures reported on it count, and Threshold of them open
// the breaker, which then refuses the next job before it takes a slot.
func TestExecutor_WarmBreakerIsTestedInTheReservation(t *testing.T) {
	t.Parallel()
	b := jobstest.New(t)
	rdb := redistest.Client(t)
	keys := &firstKeys{}
	rdb.AddHook(keys)
	prefix := redistest.Prefix(t)
	lim, err := limiter.New(rdb, &limiter.Config{Prefix: prefix})
	require.NoError(t, err)
	brk, err := breaker.New(rdb, &breaker.Config{Prefix: prefix, Threshold: 2, Cooldown: time.Hour})
	require.NoError(t, err)
	sim := llmsim.New(llmsim.Config{})
	srv := httptest.NewServer(sim)
	t.Cleanup(srv.Close)
	p, err := llm.New(llm.Config{Kind: llm.KindAnthropic, BaseURL: srv.URL, APIKey: "sk-warm"})
	require.NoError(t, err)
	gate, circuit := lim.Gate("sk-warm", "default"), brk.Circuit("sk-warm", "default")
	ex := executor.New(executor.Config{Store: b.Store, Upstreams: map[string]executor.Upstream{
		"default": {Name: "default", Kind: string(llm.KindAnthropic), Provider: p, Gate: gate, Circuit: circuit},
	}})

	// Given a breaker that is cold (it has heard no success): the first job asks it
	got, err := process(t, b, ex, "default", 1, time.Minute)
	require.NoError(t, err)
	require.Equal(t, jobs.StatusSucceeded, got.Status)
	require.Positive(t, keys.count(":cb"), "a cold breaker is asked in its own script")

	// When a job runs on the now warm breaker
	keys.reset()
	got, err = process(t, b, ex, "default", 1, time.Minute)
	require.NoError(t, err)
	require.Equal(t, jobs.StatusSucceeded, got.Status)

	// Then the breaker's only script was the report after the call, and the reservation (whose
	// first key is the rate hash) made its test
	require.Equal(t, []string{"report"}, keys.scriptsOn(":cb"), "no breaker round trip before the call")
	require.Positive(t, keys.count(":rl"))

	// When the provider fails twice (the threshold), each job admitted by the reservation's test
	require.NoError(t, sim.SetFaults(llmsim.Faults{FailNext: 2, FailNextStatus: 500}))
	for range 2 {
		got, err = process(t, b, ex, "default", 1, time.Minute)
		require.NoError(t, err)
		require.Equal(t, jobs.StatusDead, got.Status, "a retryable failure with no attempt left")
	}

	// Then the failures reported on those admissions opened the breaker
	st, err := circuit.Status(t.Context())
	require.NoError(t, err)
	require.Equal(t, breaker.Open, st.State)

	// And the next job is deferred by the breaker without taking a slot or counting an attempt
	got, err = process(t, b, ex, "default", 1, time.Minute)
	require.ErrorContains(t, err, "circuit open")
	require.Equal(t, jobs.StatusQueued, got.Status)
	require.Zero(t, got.Attempts)
	require.Nil(t, got.SlotSeq)
}

// firstKeys records the first key of every script a Redis client runs, and whether it was the
// breaker's report (its outcome among the arguments), in order.
type firstKeys struct {
	mu      sync.Mutex
	keys    []string
	reports []bool
}

func (h *firstKeys) note(cmd redis.Cmder) {
	args := cmd.Args()
	if n := cmd.Name(); (n != "evalsha" && n != "eval") || len(args) < 4 {
		return
	}
	k, _ := args[3].(string)
	report := false
	for _, a := range args[4:] {
		if s, _ := a.(string); s == "success" || s == "failure" || s == "neutral" {
			report = true
		}
	}
	h.mu.Lock()
	h.keys = append(h.keys, k)
	h.reports = append(h.reports, report)
	h.mu.Unlock()
}

func (h *firstKeys) reset() {
	h.mu.Lock()
	h.keys, h.reports = nil, nil
	h.mu.Unlock()
}

// count is how many scripts ran with a first key ending in suffix.
func (h *firstKeys) count(suffix string) int {
	return len(h.scriptsOn(suffix))
}

// scriptsOn names the scripts that ran with a first key ending in suffix, in order: "report"
// for the breaker's report of an outcome, "script" for any other.
func (h *firstKeys) scriptsOn(suffix string) []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []string
	for i, k := range h.keys {
		if !strings.HasSuffix(k, suffix) {
			continue
		}
		if h.reports[i] {
			out = append(out, "report")
		} else {
			out = append(out, "script")
		}
	}
	return out
}

func (h *firstKeys) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *firstKeys) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.note(cmd)
		return next(ctx, cmd)
	}
}

func (h *firstKeys) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, c := range cmds {
			h.note(c)
		}
		return next(ctx, cmds)
	}
}
