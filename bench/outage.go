package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/llmq/llmq/internal/config"
	"github.com/llmq/llmq/internal/llmsim"
)

// outage is `bench outage`: n jobs submitted at once while the provider answers 529 for a
// while, at plain asynq, the best plain client and llmq with its circuit breaker.
type outage struct {
	s           *shared
	outage      time.Duration
	cooldown    time.Duration
	maxCooldown time.Duration
	threshold   int
	results     []result
}

// The outage targets, for the llmq rows: every job succeeds; while the provider is down it gets
// the probes only; and once it is back, the jobs drain as fast as its limit allows. The tuned row
// (breaker set for this outage, limit configured) must see the recovery within
// outageRecoverySlack; the defaults row (nothing configured but the credential, two workers, as a
// new user runs it) within outageDefaultsSlack.
const (
	outageMaxRequests   = 10               // provider requests during the outage
	outageMaxPerSuccess = 1.1              // provider requests per succeeded job
	outageRecoverySlack = 3 * time.Second  // tuned: last result ≤ recovery + drain + this
	outageDefaultsSlack = 10 * time.Second // defaults: last result ≤ recovery + drain + this
	outageLLMQ          = "llmq"           // the tuned row
	outageDefaults      = "llmq-defaults"  // the shipped defaults' row
	outageDefaultsProcs = 2                // worker processes of the defaults row
	outageMaxAttempts   = 50               // the llmq jobs' max_attempts: the outage must not exhaust them
)

func (o *outage) rows() []burstRow {
	s := o.s
	return []burstRow{
		{id: "asynq", name: "asynq, default retry", run: runAsynq},
		{id: "retry-after8", name: "Retry-After + full jitter, 8 attempts", run: func(ctx context.Context, e *rowEnv) ([]outcome, error) {
			return runStrategy(ctx, e, strategy{attempts: 8, delay: retryAfterJitter(backoffBase, backoffCap)}), nil
		}},
		{id: outageLLMQ, name: fmt.Sprintf("llmq (%d workers, breaker %d / %s–%s)", s.workers, o.threshold, o.cooldown, o.effectiveMaxCooldown()),
			run: llmqRow(llmqSetup{
				limits:  &config.Limits{RequestsPerSecond: s.rate, Burst: int(s.capacity)},
				breaker: &config.Breaker{Threshold: o.threshold, Cooldown: o.cooldown, MaxCooldown: o.maxCooldown, ColdStartCap: new(true)},
			})},
		{id: outageDefaults, name: fmt.Sprintf("llmq, shipped defaults (%d workers; no limits, no breaker section)", outageDefaultsProcs),
			run: llmqRow(llmqSetup{workers: outageDefaultsProcs})},
	}
}

// judged reports whether row id is judged against the targets, and the recovery slack it gets.
func judged(id string) (time.Duration, bool) {
	switch id {
	case outageLLMQ:
		return outageRecoverySlack, true
	case outageDefaults:
		return outageDefaultsSlack, true
	}
	return 0, false
}

func (o *outage) flags(fs *flagSet, s *shared) {
	o.s = s
	s.base(fs, 4)
	s.redis(fs)
	s.jobs(fs, 200, "jobs submitted at once")
	s.bucket(fs, 50, 25)
	s.deadline(fs, 3*time.Minute, "cap on each row, from its first submit (longer than -outage)")
	s.seeded(fs)
	s.rows(fs, rowIDs(o.rows()))
	fs.positiveDuration(&o.outage, "outage", 20*time.Second, "how long the simulator answers 529 overloaded, from the first submit")
	fs.durationAtLeast(&o.cooldown, "cooldown", 2*time.Second, time.Millisecond, "llmq's breaker cooldown (llmq's default is 30s)")
	fs.DurationVar(&o.maxCooldown, "max-cooldown", 2800*time.Millisecond,
		"llmq's breaker max_cooldown, the cap of the cooldown's doubling after failed probes (0: llmq's default, 2 × -cooldown)")
	fs.intAtLeast(&o.threshold, "threshold", 3, 1, "llmq's breaker threshold (consecutive server-side failures that open it)")
	fs.check(func() error {
		switch {
		case o.maxCooldown != 0 && o.maxCooldown < o.cooldown:
			return errors.New("-max-cooldown: must be 0 or at least -cooldown")
		case s.timeout <= o.outage:
			return errors.New("-timeout: must be longer than -outage")
		}
		return nil
	})
}

// effectiveMaxCooldown is the breaker's max_cooldown as llmq applies it.
func (o *outage) effectiveMaxCooldown() time.Duration {
	if o.maxCooldown == 0 {
		return 2 * o.cooldown
	}
	return o.maxCooldown
}

func (o *outage) run(ctx context.Context, log logf) error {
	rows, err := selectRows(o.rows(), o.s.only)
	if err != nil {
		return err
	}
	for _, r := range rows {
		if _, ok := judged(r.id); ok {
			if err := o.s.binaries(ctx, log); err != nil {
				return err
			}
		}
	}
	log("%d jobs at once; 529 for %s from the first submit; bucket %g refilling %g/s (drain %s); %d rows",
		o.s.n, o.outage, o.s.capacity, o.s.rate, seconds(o.s.floor()), len(rows))
	b := burst{shared: o.s, sim: llmsim.Config{Capacity: o.s.capacity, RefillPerSecond: o.s.rate}, outage: o.outage,
		maxAttempts: outageMaxAttempts}
	o.results = b.runRows(ctx, log, rows)
	return nil
}

// checks judges r against the outage targets with the recovery slack of its row. The drain is
// the time the provider's bucket needs to serve every job once it is healthy.
func (o *outage) checks(r result, slack time.Duration) []check {
	if r.err != nil {
		return []check{{what: "run", got: "failed", target: "done"}}
	}
	drain := o.s.floor()
	perSuccess, ok := r.perSuccess()
	lag := o.lag(r)
	return []check{
		{what: "succeeded", got: fmt.Sprintf("%d/%d", r.succeeded, r.n), target: fmt.Sprintf("%d/%d", r.n, r.n), pass: r.succeeded == r.n},
		{what: "requests during the outage", got: fmt.Sprint(r.during), target: fmt.Sprintf("≤ %d", outageMaxRequests),
			pass: r.during <= outageMaxRequests},
		{what: "requests per success", got: ratioText(perSuccess, ok), target: fmt.Sprintf("≤ %.1f", outageMaxPerSuccess),
			pass: ok && perSuccess <= outageMaxPerSuccess+1e-9},
		{what: "recovery → last result", got: lag, target: fmt.Sprintf("≤ drain %s + %s", seconds(drain), seconds(slack)),
			pass: r.complete && r.last-o.outage <= drain+slack},
	}
}

// lag renders the time from the recovery to the last final outcome (negative when every job
// ended before the recovery).
func (o *outage) lag(r result) string {
	if !r.complete {
		return "> " + seconds(r.last-o.outage)
	}
	return seconds(r.last - o.outage)
}

// outageHeader is the header of the outage table.
var outageHeader = []string{"strategy", "succeeded", "requests during outage", "529s", "429s", "total requests",
	"requests/success", "recovery → last result", "target"}

func (o *outage) report() report {
	s := o.s
	j := func(r result) []check {
		slack, ok := judged(r.id)
		if !ok {
			return nil
		}
		return o.checks(r, slack)
	}
	var rows [][]string
	for _, r := range o.results {
		if r.err != nil {
			rows = append(rows, []string{r.name, "error", "", "", "", "", "", "", verdict(j(r))})
			continue
		}
		perSuccess, ok := r.perSuccess()
		rows = append(rows, []string{r.name, fmt.Sprintf("%d/%d", r.succeeded, r.n), fmt.Sprint(r.during),
			fmt.Sprint(r.answered(529)), fmt.Sprint(r.answered(http.StatusTooManyRequests)), fmt.Sprint(r.requests()),
			ratioText(perSuccess, ok), o.lag(r), verdict(j(r))})
	}
	notes := []string{fmt.Sprintf("%d jobs at once; 529 for %s from the first submit; bucket of %g refilling %g/s, so the drain "+
		"after the recovery is %s; llmq jobs with max_attempts %d.", s.n, o.outage, s.capacity, s.rate, s.floorText(), outageMaxAttempts)}
	judged, failed := burstNotes(o.results, j)
	return report{tables: []table{{outageHeader, rows}}, notes: append(notes, judged...), failed: failed}
}
