package executor_test

import (
	"testing"
	"time"

	"github.com/llmq/llmq/internal/dispatch"
	"github.com/llmq/llmq/internal/estimator"
	"github.com/llmq/llmq/internal/executor"
	"github.com/llmq/llmq/internal/jobs"
	"github.com/llmq/llmq/internal/llm"
	"github.com/llmq/llmq/internal/llmsim"
	"github.com/llmq/llmq/internal/pgtest"
	"github.com/llmq/llmq/internal/redistest"
)

// BenchmarkExecutor_Process runs one delivery of a committed job through the worker's path
// (load, guard, breaker, limiter, begin, the simulator's answer, record, bookkeeping) against the
// real Postgres and Redis: a worker's own cost per job, for its allocation profile (see
// docs/benchmarks.md). The job's commit is outside the timer; the simulator's server runs in
// the same process, its allocations counted too.
func BenchmarkExecutor_Process(b *testing.B) {
	ctx := b.Context()
	store := jobs.NewStore(pgtest.Pool(b), nil)
	lim, brk := sharedAdmission(b, redistest.Client(b))
	p := simProvider(b, llmsim.Config{Capacity: 1_000_000, RefillPerSecond: 1_000_000,
		InputTokensPerMinute: 1_000_000_000, OutputTokensPerMinute: 1_000_000_000}, "sk-bench")
	est, err := estimator.New(nil)
	if err != nil {
		b.Fatal(err)
	}
	ex := executor.New(executor.Config{Store: store, Estimator: est, Upstreams: map[string]executor.Upstream{
		"default": {Name: "default", Kind: string(llm.KindAnthropic), Provider: p,
			Gate: lim.Gate("sk-bench", "default"), Circuit: brk.Circuit("sk-bench", "default")},
	}})
	b.Cleanup(ex.Stop)
	create := func() string {
		job, _, err := store.Create(ctx, jobs.CreateParams{Tenant: "default", Credential: "default",
			Request: helloRequest, MaxAttempts: 3, Timeout: time.Minute})
		if err != nil {
			b.Fatal(err)
		}
		return job.ID
	}
	if err := ex.Process(ctx, dispatch.Delivery{JobID: create()}); err != nil { // connections made, the limit learnt
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		b.StopTimer()
		id := create()
		b.StartTimer()
		if err := ex.Process(ctx, dispatch.Delivery{JobID: id}); err != nil {
			b.Fatal(err)
		}
	}
}
