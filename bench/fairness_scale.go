package main

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/llmq/llmq/internal/config"
	"github.com/llmq/llmq/internal/llmsim"
)

// scale is behaviour 6, on llmq only: B's wait under scenario 1 with -backlog of A's low jobs
// waiting (queued with the workers stopped, then the workers started as B begins), and the drain
// rate of -drain-jobs of A's jobs alone on an instant, unlimited provider, with fair-queueing
// lanes and (given -baseline-bin) with the binaries built before them.
func (f *fairness) scale(ctx context.Context, log logf) []fairRow {
	var rows []fairRow
	if f.backlog > 0 {
		name := fmt.Sprintf("6. A: %d low waiting, B one normal/s", f.backlog)
		row, err := f.bigFlood(ctx, prefixed(log, name+", llmq: "))
		if err != nil {
			log("%s: error: %v", name, err)
			row = fairRow{err: err}
		}
		row.name, row.system = name, "llmq"
		rows = append(rows, row)
	}
	if f.drainJobs <= 0 {
		return rows
	}
	name := fmt.Sprintf("6. A drains %d alone (instant provider)", f.drainJobs)
	// Alternating pairs, each pair's two runs close in time and in swapped order from one pair
	// to the next: single drains on the shared machine range widely, and a pair's ratio is
	// steadier than the ratio of two medians taken minutes apart.
	var baseRates, rates, ratios []float64
	var baseRow, row fairRow
	for k := range max(1, f.drainPairs) {
		runBase := func() {
			baseRow = f.drainRow(ctx, prefixed(log, fmt.Sprintf("%s, without lanes, pair %d: ", name, k+1)), f.baseBin)
			baseRates = append(baseRates, baseRow.rps)
		}
		if f.baseBin != "" && k%2 == 0 {
			runBase()
		}
		row = f.drainRow(ctx, prefixed(log, fmt.Sprintf("%s, llmq, pair %d: ", name, k+1)), f.s.bin)
		rates = append(rates, row.rps)
		if f.baseBin != "" && k%2 == 1 {
			runBase()
		}
		if f.baseBin != "" && baseRates[k] > 0 {
			ratios = append(ratios, rates[k]/baseRates[k])
			log("%s, pair %d: %.2f ×", name, k+1, ratios[len(ratios)-1])
		}
	}
	if f.baseBin != "" {
		baseRow.rps = median(baseRates)
		baseRow.rpsText = drainText(baseRates)
		baseRow.name, baseRow.system = name, "llmq without lanes"
		rows = append(rows, baseRow)
	}
	row.rps, row.rpsText = median(rates), drainText(rates)
	if len(ratios) > 0 {
		r := median(ratios)
		row.target = "≥ 0.9 × without lanes (median of the pairs)"
		row.share = fmt.Sprintf("%.2f × without lanes (pairs %s)", r, pairRatiosText(ratios))
		row.pass = row.pass && r >= 0.9
	}
	row.name, row.system = name, "llmq"
	return append(rows, row)
}

// pairRatiosText renders each pair's ratio.
func pairRatiosText(ratios []float64) string {
	each := make([]string, len(ratios))
	for i, r := range ratios {
		each[i] = fmt.Sprintf("%.2f", r)
	}
	return strings.Join(each, ", ")
}

// drainText renders the median drain rate and each run's.
func drainText(rates []float64) string {
	each := make([]string, len(rates))
	for i, r := range rates {
		each[i] = fmt.Sprintf("%.0f", r)
	}
	return fmt.Sprintf("%.0f jobs/s (%s; no limit)", median(rates), strings.Join(each, ", "))
}

// bigFloodPass is the time allowed per backlog job for the workers' first pass over it, on top of
// -timeout (5 ms: 200 jobs/s, half what the loaded bench machine did).
const bigFloodPass = 5 * time.Millisecond

// bigFlood is scenario 6's B part: A's backlog is queued with the workers stopped, then the
// workers start and B submits as in scenario 1.
func (f *fairness) bigFlood(ctx context.Context, log logf) (fairRow, error) {
	sim := llmsim.New(llmsim.Config{Capacity: f.s.capacity, RefillPerSecond: f.s.rate})
	plog := &providerLog{next: sim}
	srv := httptest.NewServer(plog)
	defer srv.Close()
	r, err := f.startLLMQ(ctx, log, f.s.bin, srv.URL, &config.Limits{RequestsPerSecond: f.s.rate, Burst: int(f.s.capacity)},
		map[string]int{"A": 1, "B": 1})
	if err != nil {
		return fairRow{}, err
	}
	defer r.stop()
	e := &fairEnv{f: f, send: r.send, plog: plog, sim: sim, log: log}
	if err := f.queueStopped(ctx, log, r, e, "A", "low", f.backlog); err != nil {
		return fairRow{}, err
	}
	// the first pass over the backlog (each job picked once) comes on top of the scenario's cap
	cctx, cancel := context.WithTimeout(ctx, f.s.timeout+time.Duration(f.backlog)*bigFloodPass)
	defer cancel()
	if err := r.st.startWorkers(cctx, f.s.workers); err != nil {
		return fairRow{}, err
	}
	row, err := f.floodB(cctx, e)
	if err != nil {
		return fairRow{}, err
	}
	row.n429 = sim.Stats().ByStatus[http.StatusTooManyRequests]
	all := sortedByTime(plog.snapshot())
	for k, a := range all {
		if a.status == http.StatusTooManyRequests && len(row.at429) < 5 {
			row.at429 = append(row.at429, seconds(a.at.Sub(all[0].at)))
			log("429 at %s (request %d of %d, %s %s)", seconds(a.at.Sub(all[0].at)), k, len(all), a.tenant, a.prio)
		}
	}
	return row, nil
}

// queueStopped stops r's workers and submits n jobs of tenantName at prio ("": the default).
func (f *fairness) queueStopped(ctx context.Context, log logf, r *llmqRun, e *fairEnv, tenantName, prio string, n int) error {
	if err := r.st.stopWorkers(); err != nil {
		return fmt.Errorf("stop the workers: %w", err)
	}
	start := time.Now()
	stop := every(10*time.Second, func(d time.Duration) { log("  %4.0fs: %d/%d queued", d.Seconds(), e.submitted.Load(), n) })
	_, err := e.submitMany(ctx, tenantName, prio, 0, n)
	stop()
	if err != nil {
		return fmt.Errorf("queue %d jobs: %w", n, err)
	}
	log("%d jobs queued in %s with the workers stopped", n, seconds(time.Since(start)))
	return nil
}

// redisCommands is Redis's count of the commands it has processed; 0 when it cannot be read.
func redisCommands(ctx context.Context, rdb redis.UniversalClient) int64 {
	info, err := rdb.Info(ctx, "stats").Result()
	if err != nil {
		return 0
	}
	n, _ := strconv.ParseInt(infoFields(info)["total_commands_processed"], 10, 64)
	return n
}

// drainRow measures the drain of -drain-jobs of A's jobs alone (no priority given: the
// baseline's api has none), queued with the workers
// stopped, on an instant, unlimited provider through a credential configured far above what
// the workers can send (so that its limit is known and the lanes apply, but never waits):
// jobs/s from the first provider request to the last.
func (f *fairness) drainRow(ctx context.Context, log logf, bin string) fairRow {
	plog := &providerLog{next: llmsim.New(llmsim.Config{})}
	srv := httptest.NewServer(plog)
	defer srv.Close()
	fail := func(err error) fairRow {
		log("error: %v", err)
		return fairRow{err: err}
	}
	r, err := f.startLLMQ(ctx, log, bin, srv.URL, &config.Limits{RequestsPerSecond: 1_000_000, Burst: 10_000}, map[string]int{"A": 1})
	if err != nil {
		return fail(err)
	}
	defer r.stop()
	e := &fairEnv{f: f, send: r.send, plog: plog, log: log}
	if err := f.queueStopped(ctx, log, r, e, "A", "", f.drainJobs); err != nil {
		return fail(err)
	}
	cctx, cancel := context.WithTimeout(ctx, f.s.timeout)
	defer cancel()
	if err := r.st.startWorkers(cctx, f.s.workers); err != nil {
		return fail(err)
	}
	_, rdb, err := redisFor(ctx, f.s.redisURL)
	if err != nil {
		return fail(err)
	}
	defer rdb.Close()
	m := &cpuMeter{adminURL: f.s.dbURL, db: r.db, rdb: rdb, api: r.st.api.pid(), workers: r.st.workerPIDs()}
	cpu0, cmds0 := m.start(ctx), redisCommands(ctx, rdb)
	all := waitFor(cctx, e, func(log []arrival) bool { return len(distinct(log)) >= f.drainJobs })
	cpu, cmds := m.stop(ctx, cpu0), redisCommands(ctx, rdb)-cmds0
	n := len(distinct(all))
	var rate float64
	if len(all) > 1 {
		rate = float64(len(all)-1) / all[len(all)-1].at.Sub(all[0].at).Seconds()
	}
	log("%d of %d served, %.0f jobs/s", n, f.drainJobs, rate)
	if n > 0 {
		per := func(g string) float64 { return float64(cpu[g].Microseconds()) / float64(n) }
		log("CPU per job: workers %.0f µs, Postgres %.0f µs, Redis %.0f µs, bench %.0f µs; Redis commands per job %.1f",
			per(cpuWorkers), per(cpuPostgres), per(cpuRedis), per(cpuBench), float64(cmds)/float64(n))
	}
	row := fairRow{waitP50: "-", waitP99: "-", share: "-", rps: rate, unseen: f.drainJobs - n, waited: f.drainJobs,
		target: "-", pass: n == f.drainJobs}
	return row
}
