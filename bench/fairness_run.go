package main

import (
	"cmp"
	"context"
	"fmt"
	"strings"
	"time"
)

// fairWindow is the window the shares are judged in.
const fairWindow = 10 * time.Second

func (f *fairness) run(ctx context.Context, log logf) error {
	if err := f.s.binaries(ctx, log); err != nil {
		return err
	}
	perSecond := int(f.s.rate)
	n := perSecond * int(f.dur.Seconds())
	f.rows = append(f.rows,
		f.scenario(ctx, log, "1. A floods low, B one normal/s", 1, 1, func(ctx context.Context, e *fairEnv) (fairRow, error) {
			return f.flood(ctx, e, n+10*perSecond)
		}),
		f.scenario(ctx, log, "2. A and B at once, weights 1:1", 1, 1, func(ctx context.Context, e *fairEnv) (fairRow, error) {
			return f.split(ctx, e, n/2, 0.5)
		}),
		f.scenario(ctx, log, "2. A and B at once, weights 2:1", 2, 1, func(ctx context.Context, e *fairEnv) (fairRow, error) {
			return f.split(ctx, e, n/2, 2.0/3)
		}),
		f.scenario(ctx, log, "3. A: low waiting, then 20 high", 1, 1, func(ctx context.Context, e *fairEnv) (fairRow, error) {
			return f.priority(ctx, e, n)
		}),
		f.scenario(ctx, log, "4. A: high saturating, low beside", 1, 1, func(ctx context.Context, e *fairEnv) (fairRow, error) {
			return f.starvation(ctx, e, n)
		}),
	)
	return nil
}

// flood is scenario 1: A submits flood low jobs at once; then B submits one normal job a second
// for the duration. B's wait is submit → provider; A's share and the rate are judged while B
// submits.
func (f *fairness) flood(ctx context.Context, e *fairEnv, flood int) (fairRow, error) {
	if _, err := e.submitMany(ctx, "A", "low", 0, flood); err != nil {
		return fairRow{}, err
	}
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
	var waits []time.Duration
	for _, a := range log {
		if a.tenant == "B" {
			waits = append(waits, a.at.Sub(subs[a.i]))
		}
	}
	from, to := subs[0], subs[len(subs)-1]
	lo, hi := shares(log, from, to, fairWindow, func(a arrival) bool { return a.tenant == "A" })
	p50, p99 := percentile(waits, 50), percentile(waits, 99)
	rps := busyRate(log, to)
	return fairRow{waitP50: seconds(p50), waitP99: seconds(p99), share: fmt.Sprintf("A %.2f-%.2f", lo, hi), rps: rps,
		target: "B p99 ≤ 0.5 s; rate ≥ 0.95 × limit",
		pass:   p99 <= 500*time.Millisecond && rps >= 0.95*f.s.rate}, nil
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
	return fairRow{waitP50: "-", waitP99: "-", share: fmt.Sprintf("A %.2f-%.2f", lo, hi), rps: busyRate(log, to),
		target: fmt.Sprintf("A %.2f ± 0.05", want), pass: lo >= want-0.05 && hi <= want+0.05}, nil
}

// priority is scenario 3: A has n low jobs waiting and submits 20 high: they reach the provider
// within 20 slots (plus half a second).
func (f *fairness) priority(ctx context.Context, e *fairEnv, n int) (fairRow, error) {
	if _, err := e.submitMany(ctx, "A", "low", 0, n); err != nil {
		return fairRow{}, err
	}
	waitFor(ctx, e, func(log []arrival) bool { return len(log) >= int(f.s.capacity)+int(2*f.s.rate) })
	subs, err := e.submitMany(ctx, "A", "high", 0, 20)
	if err != nil {
		return fairRow{}, err
	}
	log := waitFor(ctx, e, func(log []arrival) bool { return count(log, "A", "high") >= 20 })
	var waits []time.Duration
	lows := 0
	var first time.Time
	for _, s := range subs {
		if first.IsZero() || s.Before(first) {
			first = s
		}
	}
	for _, a := range log {
		if a.prio == "high" {
			waits = append(waits, a.at.Sub(subs[a.i]))
		}
	}
	last := lastOf(log, "A", "high")
	for _, a := range log {
		if a.prio == "low" && a.at.After(first) && a.at.Before(last) {
			lows++
		}
	}
	limit := time.Duration(20/f.s.rate*float64(time.Second)) + 500*time.Millisecond
	worst := percentile(waits, 100)
	return fairRow{waitP50: seconds(percentile(waits, 50)), waitP99: seconds(worst),
		share: fmt.Sprintf("%d low between", lows), rps: busyRate(log, last),
		target: "all 20 high ≤ " + seconds(limit), pass: worst <= limit}, nil
}

// starvation is scenario 4: A submits n high and n/2 low jobs at once; low keeps its minimum
// share (5%) in every window while high saturates the credential.
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
	lo, hi := shares(log, from, to, fairWindow, func(a arrival) bool { return a.prio == "low" })
	return fairRow{waitP50: "-", waitP99: "-", share: fmt.Sprintf("low %.3f-%.3f", lo, hi), rps: busyRate(log, to),
		target: "low ≥ 0.045 per window", pass: lo >= 0.045}, nil
}

// waitFor waits until done holds of the provider's log (sorted by time), or ctx ends.
func waitFor(ctx context.Context, e *fairEnv, done func([]arrival) bool) []arrival {
	for {
		log := sortedByTime(e.plog.snapshot())
		if done(log) || ctx.Err() != nil {
			return log
		}
		select {
		case <-ctx.Done():
		case <-time.After(100 * time.Millisecond):
		}
	}
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
var fairHeader = []string{"scenario", "wait p50", "wait p99", "share per 10 s (min-max)", "429s", "req/s (limit)", "target", "result"}

func (f *fairness) report() report {
	var rows [][]string
	var failed, at429 []string
	for _, r := range f.rows {
		if len(r.at429) > 0 {
			at429 = append(at429, fmt.Sprintf("%s at %s", r.name, strings.Join(r.at429, ", ")))
		}
		if r.err != nil {
			rows = append(rows, []string{r.name, "-", "-", "-", "-", "-", "-", "error: " + r.err.Error()})
			failed = append(failed, r.name)
			continue
		}
		verdict := "FAIL"
		if r.pass && r.n429 == 0 {
			verdict = "PASS"
		}
		rows = append(rows, []string{r.name, r.waitP50, r.waitP99, r.share, fmt.Sprint(r.n429),
			fmt.Sprintf("%.2f (%g)", r.rps, f.s.rate), r.target, verdict})
	}
	notes := []string{
		fmt.Sprintf("llmq only, %d worker processes sharing one credential of %g requests/s, burst %g (the simulator's bucket); "+
			"each scenario keeps it busy about %s; shares judged on the provider's log in 10 s windows while both kinds have work.",
			f.s.workers, f.s.rate, f.s.capacity, seconds(f.dur)),
		"wait: submit → the request's arrival at the provider (scenario 1: B's jobs; 3: the 20 high jobs). Scenario 4's minimum share is " +
			"judged per 10 s, not per minute, to keep the run short. Every scenario also needs 0 429s.",
		"429s, from the first provider request: " + cmp.Or(strings.Join(at429, "; "), "none") + ".",
		"Not measured yet: asynq with three weighted queues beside it, and the 100,000-job backlog (behaviour 6).",
	}
	return report{tables: []table{{fairHeader, rows}}, notes: notes, failed: failed}
}
