package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/llmq/llmq/internal/llmsim"
)

// batchBench is `bench batch`: n jobs with "lane": "auto" and a 24h deadline on a credential
// whose batch lane is on, against the simulator's batch API with its window scaled down; 100
// interactive online jobs on the same credential before (alone) and while the batch jobs are
// in flight; every worker SIGKILLed once mid-way (the batcher's leader among them) and started
// again. Targets: cost ≤ 0.52 × the same jobs online, every job ended exactly once, each batch
// job sent to the provider once, and the interactive p99 not worse than alone (indicative on a
// loaded machine).
type batchBench struct {
	o           tpOpts
	interactive int
	delay       time.Duration // the simulator's processing delay of a batch
	window      time.Duration // the credential's batch window (and the simulator's)
	maxReqs     int

	alone, during  []time.Duration // interactive submit → finished
	batchWait      []time.Duration // batch jobs' submit → finished
	batchCost      float64
	onlineCost     float64
	statuses       map[string]int
	costClasses    map[string]int
	endedTwice     int
	stats          llmsim.BatchStats
	onlineCalls    int
	killedAt       string
	totalTime      time.Duration
	batchesAtCrash int
}

const batchMarker = "bench-batch"

// batchFallback is the credential's online_fallback (and max_wait_to_fill): -window must exceed it.
const batchFallback = time.Second

// batchYAML is the credential's batch block.
func (b *batchBench) batchYAML() string {
	return fmt.Sprintf("{ enabled: true, max_requests_per_batch: %d, max_wait_to_fill: %s, poll_interval: 500ms, window: %s, online_fallback: %s }",
		b.maxReqs, batchFallback, b.window, batchFallback)
}

func (b *batchBench) flags(fs *flagSet, s *shared) {
	b.o.flags(fs, s, false)
	s.jobs(fs, 10_000, "jobs with lane auto")
	s.deadline(fs, 10*time.Minute, "cap on the wait for every job")
	fs.intAtLeast(&b.interactive, "interactive", 100, 1, "online jobs submitted alone, then while the batch jobs are in flight")
	fs.positiveDuration(&b.delay, "batch-delay", 5*time.Second, "the simulator's time from a batch's creation to its end")
	fs.DurationVar(&b.window, "window", time.Minute, "the batch window, scaled down from 24h (the credential's and the simulator's); more than 1s, the credential's online_fallback")
	fs.check(func() error {
		// The config llmq loads takes a window above its online_fallback (and at least its
		// max_wait_to_fill), both 1s here, and at most 24h: refused here, not by the config
		// once the database was made, naming a field the bench wrote.
		if b.window <= batchFallback || b.window > 24*time.Hour {
			return fmt.Errorf("-window: must be more than %s (the credential's online_fallback) and at most 24h", batchFallback)
		}
		return nil
	})
	fs.intAtLeast(&b.maxReqs, "max-requests", 1000, 1, "max_requests_per_batch")
}

func (b *batchBench) run(ctx context.Context, log logf) error {
	if err := b.o.binaries(ctx, log); err != nil {
		return err
	}
	var c cleanups
	defer c.run()
	sim := llmsim.New(llmsim.Config{Batch: llmsim.BatchConfig{ProcessingDelay: b.delay, Window: b.window}})
	srv := httptest.NewServer(sim)
	c.add(srv.Close)
	batchYAML := b.batchYAML()
	d, err := deploy(ctx, deployOpts{adminURL: b.o.dbURL, redisURL: b.o.redisURL, simURL: srv.URL, setup: llmqSetup{batch: batchYAML}})
	if err != nil {
		return err
	}
	failed := true
	c.add(func() { d.close(b.o.keepLogs || failed, log) })
	cfg := d.stack(b.o.bin, b.o.redisURL)
	cfg.gomaxprocs = b.o.gomaxprocs
	st, err := startStack(ctx, cfg, b.o.workers)
	if err != nil {
		return err
	}
	c.add(func() { _ = st.stop() })
	obs, err := pgxpool.New(ctx, d.dbURL)
	if err != nil {
		return fmt.Errorf("open observer pool: %w", err)
	}
	c.add(obs.Close)
	hc := &http.Client{Timeout: 30 * time.Second}
	c.add(hc.CloseIdleConnections)
	submit := func(i int, lane string) error {
		body := fmt.Appendf(nil, `{"lane":%q,"timeout":"24h","max_attempts":3,"metadata":{"kind":%q},"request":%s}`,
			lane, map[string]string{"auto": batchMarker, "online": "interactive"}[lane], messagesBody(i))
		_, err := submitJob(ctx, hc, st.apiURL, i, body)
		return err
	}
	start := time.Now()

	log("%d interactive jobs alone", b.interactive)
	if err := parallel(ctx, 10, 0, b.interactive, func(i int) error { return submit(i, "online") }); err != nil {
		return err
	}
	if err := waitAllEnded(ctx, obs, b.o.timeout); err != nil {
		return err
	}
	if b.alone, err = latencies(ctx, obs, "interactive", time.Time{}); err != nil {
		return err
	}
	during := time.Now()
	log("%d batch-lane jobs (lane auto) by %d clients, %d interactive jobs meanwhile", b.o.n, b.o.clients, b.interactive)
	var wg sync.WaitGroup
	var interErr error
	var half atomic.Bool
	wg.Add(1)
	go func() {
		defer wg.Done()
		for !half.Load() && ctx.Err() == nil {
			time.Sleep(10 * time.Millisecond)
		}
		interErr = parallel(ctx, 10, b.interactive, b.interactive, func(i int) error { return submit(i, "online") })
	}()
	var done atomic.Int64
	err = parallel(ctx, b.o.clients, b.interactive*2, b.o.n, func(i int) error {
		if done.Add(1) >= int64(b.o.n/2) {
			half.Store(true)
		}
		return submit(i, "auto")
	})
	half.Store(true)
	wg.Wait()
	if err = errors.Join(err, interErr); err != nil {
		return err
	}

	// Crash: once the provider holds a batch, every worker (the leader among them) is killed.
	for sim.BatchStats().Created == 0 && ctx.Err() == nil {
		time.Sleep(20 * time.Millisecond)
	}
	b.batchesAtCrash = sim.BatchStats().Created
	b.killedAt = seconds(time.Since(during))
	log("SIGKILL every worker at %s (%d batches created), then start them again", b.killedAt, b.batchesAtCrash)
	for _, p := range st.workers {
		_ = p.cmd.Process.Kill()
		<-p.done
	}
	st.workers, st.metricsAddrs = nil, nil
	if err := st.startWorkers(ctx, b.o.workers); err != nil {
		return err
	}
	if err := waitAllEnded(ctx, obs, b.o.timeout); err != nil {
		return err
	}
	b.totalTime = time.Since(start)
	if b.during, err = latencies(ctx, obs, "interactive", during); err != nil {
		return err
	}
	if b.batchWait, err = latencies(ctx, obs, batchMarker, time.Time{}); err != nil {
		return err
	}
	if err := b.tally(ctx, obs); err != nil {
		return err
	}
	b.stats, b.onlineCalls = sim.BatchStats(), sim.Stats().Requests
	failed = false
	return nil
}

// tally reads the batch jobs' statuses, cost classes and usage, and the jobs that ended twice.
func (b *batchBench) tally(ctx context.Context, obs *pgxpool.Pool) error {
	b.statuses, b.costClasses = map[string]int{}, map[string]int{}
	rows, err := obs.Query(ctx, `SELECT status, coalesce(CASE WHEN status = 'succeeded' THEN lane END, '-'),
	coalesce((usage->>'input_tokens')::int, 0), coalesce((usage->>'output_tokens')::int, 0)
FROM jobs WHERE metadata->>'kind' = $1`, batchMarker)
	if err != nil {
		return fmt.Errorf("read batch jobs: %w", err)
	}
	var status, class string
	var in, out int
	if _, err := pgx.ForEachRow(rows, []any{&status, &class, &in, &out}, func() error {
		b.statuses[status]++
		b.costClasses[class]++
		b.batchCost += llmsim.Cost(in, out, class == "batch")
		b.onlineCost += llmsim.Cost(in, out, false)
		return nil
	}); err != nil {
		return fmt.Errorf("read batch jobs: %w", err)
	}
	return obs.QueryRow(ctx, `SELECT count(*) FROM (SELECT job_id FROM job_events
WHERE type IN ('succeeded', 'failed', 'dead', 'canceled') GROUP BY job_id HAVING count(*) > 1) twice`).Scan(&b.endedTwice)
}

// parallel runs f(first), …, f(first+n-1) on clients goroutines; the first error stops it.
func parallel(ctx context.Context, clients, first, n int, f func(i int) error) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var next atomic.Int64
	var wg sync.WaitGroup
	for range clients {
		wg.Go(func() {
			for ctx.Err() == nil {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				if err := f(first + i); err != nil {
					cancel(err)
				}
			}
		})
	}
	wg.Wait()
	return context.Cause(ctx)
}

// waitAllEnded waits until no job is unfinished, for at most timeout.
func waitAllEnded(ctx context.Context, obs *pgxpool.Pool, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		var n int
		if err := obs.QueryRow(ctx, `SELECT count(*) FROM jobs WHERE status IN ('queued', 'running', 'retrying')`).Scan(&n); err != nil {
			return fmt.Errorf("count unfinished jobs: %w", err)
		}
		if n == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d jobs unfinished after %s", n, timeout)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// latencies returns submit → finished of the jobs of kind created since since.
func latencies(ctx context.Context, obs *pgxpool.Pool, kind string, since time.Time) ([]time.Duration, error) {
	rows, err := obs.Query(ctx, `SELECT extract(epoch FROM finished_at - created_at) FROM jobs
WHERE metadata->>'kind' = $1 AND created_at >= $2 AND finished_at IS NOT NULL`, kind, since)
	if err != nil {
		return nil, fmt.Errorf("read latencies: %w", err)
	}
	var out []time.Duration
	var s float64
	_, err = pgx.ForEachRow(rows, []any{&s}, func() error {
		out = append(out, time.Duration(s*float64(time.Second)))
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("read latencies: %w", err)
	}
	return out, nil
}

func (b *batchBench) checks() []check {
	ratio := 0.0
	if b.onlineCost > 0 {
		ratio = b.batchCost / b.onlineCost
	}
	calls := b.stats.Created + b.stats.Polls + b.stats.Results + b.stats.Uploads + b.stats.Cancels
	p99Alone, p99During := percentile(b.alone, 99), percentile(b.during, 99)
	return []check{
		{what: "cost per 1,000 jobs vs online", got: fmt.Sprintf("%.3f ×", ratio), target: "≤ 0.52 ×", pass: ratio > 0 && ratio <= 0.52},
		{what: "batch jobs succeeded", got: fmt.Sprintf("%d/%d", b.statuses["succeeded"], b.o.n), target: fmt.Sprintf("%d/%d", b.o.n, b.o.n),
			pass: b.statuses["succeeded"] == b.o.n},
		{what: "jobs that ended twice", got: fmt.Sprint(b.endedTwice), target: "0", pass: b.endedTwice == 0},
		{what: "batch requests sent (paid) per job", got: fmt.Sprintf("%.3f", float64(b.stats.Requests)/float64(b.o.n)), target: "1.000",
			pass: b.stats.Requests == b.o.n},
		{what: "slowest batch job vs the window", got: seconds(percentile(b.batchWait, 100)), target: "≤ " + seconds(b.window),
			pass: percentile(b.batchWait, 100) <= b.window},
		{what: "provider batch calls per 1,000 jobs", got: fmt.Sprintf("%.1f", float64(calls)*1000/float64(b.o.n))},
		{what: "interactive p99 alone → during", got: fmt.Sprintf("%s → %s", msText(p99Alone), msText(p99During))},
	}
}

func (b *batchBench) report() report {
	var rows [][]string
	for _, c := range b.checks() {
		rows = append(rows, []string{c.what, c.got, c.target, verdict([]check{c})})
	}
	return report{
		tables: []table{{header: []string{"measure", "got", "target", ""}, rows: rows}},
		notes: []string{
			fmt.Sprintf("%s jobs with \"lane\": \"auto\" and a 24h deadline on an Anthropic credential with batch: {max_requests_per_batch: %d, "+
				"max_wait_to_fill: 1s, poll_interval: 500ms, window: %s}, against llmsim's Message Batches ending each batch %s after its "+
				"creation; %d llmq workers, %d clients. Cost from each job's stored usage at llmsim's price table ($%g/$%g per MTok in/out, "+
				"batch × %g): the batch jobs as stored ÷ the same tokens online. Cost classes of the batch jobs: %v.",
				thousands(b.o.n), b.maxReqs, b.window, b.delay, b.o.workers, b.o.clients, llmsim.Price.InputPerMTok, llmsim.Price.OutputPerMTok,
				llmsim.Price.BatchDiscount, b.costClasses),
			fmt.Sprintf("Provider batch calls: %d batches created, %d polls, %d result downloads, %d cancels (%d online calls: the interactive jobs'). "+
				"Every worker was SIGKILLed %s after the batch jobs' submission began, %d batch(es) created by then, and started again; all jobs ended in %s.",
				b.stats.Created, b.stats.Polls, b.stats.Results, b.stats.Cancels, b.onlineCalls, b.killedAt, b.batchesAtCrash, seconds(b.totalTime)),
			fmt.Sprintf("Interactive: %d online jobs on the same credential, submit → result, alone (p50 %s, p99 %s) and submitted while the batch jobs were "+
				"being submitted (p50 %s, p99 %s). Timed figures come from a shared, loaded 2-core machine: indicative only.",
				b.interactive, msText(percentile(b.alone, 50)), msText(percentile(b.alone, 99)), msText(percentile(b.during, 50)), msText(percentile(b.during, 99))),
		},
	}
}
