package main

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"
	"time"
)

// fairWindow is the window the shares are judged in.
const fairWindow = 10 * time.Second

// fairScenario is one of the fairness scenarios: tenants A and B of weights wA and wB, and what
// they submit and how it is judged.
type fairScenario struct {
	name   string
	wA, wB int
	drive  func(context.Context, *fairEnv) (fairRow, error)
}

func (f *fairness) run(ctx context.Context, log logf) error {
	ids, err := selectIDs([]string{"llmq", "asynq"}, f.s.only)
	if err != nil {
		return err
	}
	systems := map[string]fairSystem{"llmq": f.llmqSystem(), "asynq": f.asynqSystem()}
	if slices.Contains(ids, "llmq") {
		if err := f.s.binaries(ctx, log); err != nil {
			return err
		}
	}
	for _, sc := range f.scenarios() {
		if !f.picked(sc.name) {
			continue
		}
		for _, id := range ids {
			f.rows = append(f.rows, f.scenario(ctx, log, systems[id], sc.name, sc.wA, sc.wB, sc.drive))
		}
	}
	if f.picked("6.") && slices.Contains(ids, "llmq") {
		f.rows = append(f.rows, f.scale(ctx, log)...)
	}
	return nil
}

// picked reports whether -scenarios names the scenario (its name starts with its number and a dot).
func (f *fairness) picked(name string) bool {
	if strings.TrimSpace(f.which) == "" {
		return true
	}
	for n := range strings.SplitSeq(f.which, ",") {
		if strings.HasPrefix(name, strings.TrimSpace(n)+".") {
			return true
		}
	}
	return false
}

func (f *fairness) scenarios() []fairScenario {
	perSecond := int(f.s.rate)
	n := perSecond * int(f.dur.Seconds())
	return []fairScenario{
		{"1. A floods low, B one normal/s", 1, 1, func(ctx context.Context, e *fairEnv) (fairRow, error) {
			return f.flood(ctx, e, n+10*perSecond)
		}},
		{"2. A and B at once, weights 1:1", 1, 1, func(ctx context.Context, e *fairEnv) (fairRow, error) {
			return f.split(ctx, e, f.splitJobs(0.5), 0.5)
		}},
		{"2. A and B at once, weights 2:1", 2, 1, func(ctx context.Context, e *fairEnv) (fairRow, error) {
			return f.split(ctx, e, f.splitJobs(2.0/3), 2.0/3)
		}},
		{"3. A: low waiting, then 20 high", 1, 1, func(ctx context.Context, e *fairEnv) (fairRow, error) {
			return f.priority(ctx, e, n)
		}},
		{"4. A: high saturating, low beside", 1, 1, func(ctx context.Context, e *fairEnv) (fairRow, error) {
			return f.starvation(ctx, e, n)
		}},
	}
}

// flood is scenario 1: A submits flood low jobs at once; then B submits one normal job a second
// for the duration (floodB).
func (f *fairness) flood(ctx context.Context, e *fairEnv, flood int) (fairRow, error) {
	if _, err := e.submitMany(ctx, "A", "low", 0, flood); err != nil {
		return fairRow{}, err
	}
	return f.floodB(ctx, e)
}

// floodB is B's part of scenarios 1 and 6: one normal job a second for the duration. B's wait is
// submit → provider; A's share and the rate are judged while B submits.
func (f *fairness) floodB(ctx context.Context, e *fairEnv) (fairRow, error) {
	var subs []time.Time
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for i := range int(f.dur.Seconds()) {
		at, err := e.submit(ctx, "B", "normal", i)
		if err != nil {
			return fairRow{}, err
		}
		subs = append(subs, at)
		select {
		case <-ctx.Done():
			return fairRow{}, ctx.Err()
		case <-tick.C:
		}
	}
	log := waitFor(ctx, e, func(log []arrival) bool { return count(log, "B", "") >= len(subs) })
	waits, missing := firstWaits(log, len(subs), func(a arrival) bool { return a.tenant == "B" }, func(i int) time.Time { return subs[i] })
	for i, w := range waits {
		if w > 300*time.Millisecond {
			e.log("B job %d (submitted at %s) waited %s", i, seconds(subs[i].Sub(subs[0])), seconds(w))
		}
	}
	from, to := subs[0], subs[len(subs)-1]
	lo, hi := shares(log, from, to, fairWindow, func(a arrival) bool { return a.tenant == "A" })
	p50, p99 := percentile(waits, 50), percentile(waits, 99)
	rps := busyRate(log, to, f.s.capacity)
	return fairRow{waitP50: waitText(p50, missing), waitP99: waitText(p99, missing), share: shareText("A", lo, hi, 2), rps: rps,
		target: "B p99 ≤ 0.5 s; rate ≥ 0.95 × limit", unseen: missing, waited: len(subs),
		pass: missing == 0 && p99 <= 500*time.Millisecond && rps >= 0.95*f.s.rate}, nil
}

// splitJobs is how many jobs each tenant submits in scenario 2 when A's share is want (at least
// a half): enough for A, the faster, to stay busy for the duration after the first burst, so
// both have work in every judged window.
func (f *fairness) splitJobs(want float64) int {
	return int(want*f.s.rate*f.dur.Seconds()) + int(f.s.capacity)
}

// split is scenario 2: A and B submit n normal jobs each at once; A's share per window while
// both have work must be want ± 0.05.
func (f *fairness) split(ctx context.Context, e *fairEnv, n int, want float64) (fairRow, error) {
	errs := make(chan error, 2)
	for _, t := range []string{"A", "B"} {
		go func() {
			_, err := e.submitMany(ctx, t, "normal", 0, n)
			errs <- err
		}()
	}
	for range 2 {
		if err := <-errs; err != nil {
			return fairRow{}, err
		}
	}
	log := waitFor(ctx, e, func(log []arrival) bool { return count(log, "A", "") >= n || count(log, "B", "") >= n })
	from := later(firstOf(log, "A"), firstOf(log, "B")).Add(2 * time.Second) // after the first burst
	to := log[len(log)-1].at
	lo, hi := shares(log, from, to, fairWindow, func(a arrival) bool { return a.tenant == "A" })
	unseen := n - max(count(log, "A", ""), count(log, "B", ""))
	return fairRow{waitP50: "-", waitP99: "-", share: shareText("A", lo, hi, 2), rps: busyRate(log, to, f.s.capacity),
		target: fmt.Sprintf("A %.2f ± 0.05", want), unseen: max(unseen, 0), waited: n,
		pass: lo <= hi && lo >= want-0.05 && hi <= want+0.05}, nil
}

// priority is scenario 3: A has n low jobs waiting and submits 20 high: they reach the provider
// within 20 slots (plus half a second).
func (f *fairness) priority(ctx context.Context, e *fairEnv, n int) (fairRow, error) {
	if _, err := e.submitMany(ctx, "A", "low", 0, n); err != nil {
		return fairRow{}, err
	}
	// The low jobs flow: the first burst and two seconds at the rate are served, or (a system
	// whose retries wait longer) that long has passed.
	settle := time.Duration((f.s.capacity/f.s.rate + 2) * float64(time.Second))
	wctx, cancel := context.WithTimeout(ctx, settle)
	waitFor(wctx, e, func(log []arrival) bool { return len(log) >= int(f.s.capacity)+int(2*f.s.rate) })
	cancel()
	subs, err := e.submitMany(ctx, "A", "high", 0, 20)
	if err != nil {
		return fairRow{}, err
	}
	log := waitFor(ctx, e, func(log []arrival) bool { return count(log, "A", "high") >= 20 })
	lows := 0
	var first time.Time
	for _, s := range subs {
		if first.IsZero() || s.Before(first) {
			first = s
		}
	}
	waits, missing := firstWaits(log, len(subs), func(a arrival) bool { return a.prio == "high" }, func(i int) time.Time { return subs[i] })
	last := lastOf(log, "A", "high")
	for _, a := range log {
		if a.prio == "low" && a.at.After(first) && a.at.Before(last) {
			lows++
		}
	}
	limit := time.Duration(20/f.s.rate*float64(time.Second)) + 500*time.Millisecond
	worst := percentile(waits, 100)
	return fairRow{waitP50: waitText(percentile(waits, 50), missing), waitP99: waitText(worst, missing),
		share: fmt.Sprintf("%d low between", lows), rps: busyRate(log, last, f.s.capacity),
		target: "all 20 high ≤ " + seconds(limit), unseen: missing, waited: len(subs), pass: missing == 0 && worst <= limit}, nil
}

// starvation is scenario 4: A submits n high and n/2 low jobs at once; low keeps its minimum
// share (5%) per minute while high saturates the credential: in every whole minute of it, or
// over all of it when it is shorter. (In 10 s windows, about 100 slots, the share is quantized:
// one low request more or less moves it by 0.01 either side of 0.05.)
func (f *fairness) starvation(ctx context.Context, e *fairEnv, n int) (fairRow, error) {
	if _, err := e.submitMany(ctx, "A", "high", 0, n); err != nil {
		return fairRow{}, err
	}
	if _, err := e.submitMany(ctx, "A", "low", 0, n/2); err != nil {
		return fairRow{}, err
	}
	log := waitFor(ctx, e, func(log []arrival) bool { return count(log, "A", "high") >= n })
	from := firstOf(log, "A").Add(2 * time.Second)
	to := lastOf(log, "A", "high")
	w := min(time.Minute, to.Sub(from))
	lo, hi := shares(log, from, to, w, func(a arrival) bool { return a.prio == "low" })
	return fairRow{waitP50: "-", waitP99: "-", share: shareText("low", lo, hi, 3), rps: busyRate(log, to, f.s.capacity),
		target: "low ≥ 0.045 per minute", unseen: max(n-count(log, "A", "high"), 0), waited: n, pass: lo <= hi && lo >= 0.045}, nil
}

// waitFor waits until done holds of the provider's log of served requests (sorted by time),
// or ctx ends (the scenario's cap: the figures are then of what was served by then).
func waitFor(ctx context.Context, e *fairEnv, done func([]arrival) bool) []arrival {
	for {
		log := served(sortedByTime(e.plog.snapshot()))
		if done(log) || ctx.Err() != nil {
			return log
		}
		select {
		case <-ctx.Done():
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// firstWaits is, for each of the n jobs (indices 0 to n-1) whose requests match, submit (sub)
// → its first served request. A job not served has its wait until now instead, a lower bound;
// missing counts them.
func firstWaits(log []arrival, n int, match func(arrival) bool, sub func(i int) time.Time) (waits []time.Duration, missing int) {
	first := map[int]time.Time{}
	for _, a := range log {
		if _, seen := first[a.i]; match(a) && !seen {
			first[a.i] = a.at
		}
	}
	now := time.Now()
	for i := range n {
		at, ok := first[i]
		if !ok {
			at = now
			missing++
		}
		waits = append(waits, at.Sub(sub(i)))
	}
	return waits, missing
}

// waitText renders a wait percentile, "≥ " when some jobs were never served (their waits are
// lower bounds).
func waitText(d time.Duration, missing int) string {
	if missing > 0 {
		return "≥ " + seconds(d)
	}
	return seconds(d)
}

// shareText renders the min and max share of what, with prec decimals; "-" when no window
// was judged.
func shareText(what string, lo, hi float64, prec int) string {
	if lo > hi {
		return what + " -"
	}
	return fmt.Sprintf("%s %.*f-%.*f", what, prec, lo, prec, hi)
}

func count(log []arrival, tenantName, prio string) int {
	n := 0
	for _, a := range log {
		if a.tenant == tenantName && (prio == "" || a.prio == prio) {
			n++
		}
	}
	return n
}

func firstOf(log []arrival, tenantName string) time.Time {
	for _, a := range log {
		if a.tenant == tenantName {
			return a.at
		}
	}
	return time.Time{}
}

func lastOf(log []arrival, tenantName, prio string) time.Time {
	var t time.Time
	for _, a := range log {
		if a.tenant == tenantName && a.prio == prio {
			t = a.at
		}
	}
	return t
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// fairHeader is the fairness table's header.
var fairHeader = []string{"scenario", "system", "wait p50", "wait p99", "share per window (min-max)", "429s", "req/s beyond the burst (limit)",
	"cut off", "target", "result"}

func (f *fairness) report() report {
	var rows [][]string
	var failed, at429 []string
	for _, r := range f.rows {
		if len(r.at429) > 0 {
			at429 = append(at429, fmt.Sprintf("%s, %s: %s", r.name, r.system, strings.Join(r.at429, ", ")))
		}
		if r.err != nil {
			rows = append(rows, []string{r.name, r.system, "-", "-", "-", "-", "-", "-", "-", "error: " + r.err.Error()})
			failed = append(failed, r.name+", "+r.system)
			continue
		}
		verdict := "FAIL"
		if r.pass && r.n429 == 0 && r.unseen == 0 {
			verdict = "PASS"
		}
		rps := cmp.Or(r.rpsText, fmt.Sprintf("%.2f (%g)", r.rps, f.s.rate))
		rows = append(rows, []string{r.name, r.system, r.waitP50, r.waitP99, r.share, fmt.Sprint(r.n429), rps, fmt.Sprintf("%d of %d", r.unseen, r.waited), r.target, verdict})
	}
	notes := []string{
		fmt.Sprintf("llmq: %d worker processes sharing one credential of %g requests/s, burst %g (the simulator's bucket). "+
			"asynq 6:3:1: %d asynq servers (default concurrency) on three weighted queues, high 6, normal 3, low 1, whose handler calls "+
			"the same simulator once per task through the plain rows' limiter-less client and returns an error on a 429, so asynq's "+
			"default retry (15 s and more) decides the rest; asynq has no tenants, so the weights of scenario 2 do not reach it. "+
			"Each scenario keeps the credential busy about %s and is cut at %s; shares judged on the provider's log in 10 s windows "+
			"(scenario 4: per minute) while both kinds have work.", f.s.workers, f.s.rate, f.s.capacity, f.s.workers, seconds(f.dur), seconds(f.s.timeout)),
		"wait: submit → the job's first request the provider answered 2xx (scenario 1: B's jobs; 3: the 20 high jobs); ≥: some of " +
			"them were not served by the cap, their wait counted until then. cut off: of the jobs a scenario waits for (1: B's; " +
			"2: all of one tenant's; 3: the 20 high; 4: the high), those not served when the cap ended it. Shares and req/s count the served requests; 429s are " +
			"the provider's. Scenario 4's minimum share is judged per minute (over the whole scenario when it keeps the credential busy for less). Targets are " +
			"the fairness targets, for llmq; the asynq rows are judged the same way for comparison; every target also needs 0 429s and every job served.",
		"429s, from the first provider request (the first 5 of each row): " + cmp.Or(strings.Join(at429, "; "), "none") + ".",
		fmt.Sprintf("6 (llmq only): A's %d low jobs are queued with the workers stopped, then the workers start as B begins "+
			"scenario 1's submits, while the workers make their first pass over the backlog (A's tasks are on the low "+
			"jobs' asynq queue, B's on the main one); the drain is %d of A's jobs alone, queued with the workers stopped, on an instant, unlimited "+
			"simulator through a credential configured at 1,000,000 requests/s (its limit known, so the lanes apply, but never "+
			"waited for), jobs/s from the first provider request to the last (the median of each build's runs, each run's rate in brackets), "+
			"in %d pairs with \"without lanes\", the api and worker built at the commit before the executor named lanes (-baseline-bin), "+
			"run back to back in an order that swaps from one pair to the next; judged by the median of the pairs' ratios. B's wait in "+
			"6 is capped at -timeout plus 5 ms per backlog job.", f.backlog, f.drainJobs, max(1, f.drainPairs)),
		"Timed on a shared, loaded 2-core machine: indicative only.",
	}
	return report{tables: []table{{fairHeader, rows}}, notes: notes, failed: failed}
}
