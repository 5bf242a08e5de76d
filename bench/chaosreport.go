package main

import (
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/llmq/llmq/internal/llmsim"
)

// chaosResult is everything a chaos run observed.
type chaosResult struct {
	tag          string
	start        time.Time
	faults       []chaosFault
	lastFaultEnd time.Duration // since start
	submits      []chaosSubmit
	// allTerminal: every accepted job was terminal when the observation ended, at
	// observedUntil; otherwise pending (IDs) were not, at the grace deadline.
	allTerminal   bool
	observedUntil time.Duration
	pending       []string
	rows          []chaosRow  // the jobs table at the end
	calls         []chaosCall // provider requests with a job marker
	unmarked      int         // provider requests without one
	refused       int         // connections the Postgres proxy refused while down
	exits         []chaosExit // processes that ended on their own
}

// chaosRecovery is the time from a fault's end to the next job that succeeded.
type chaosRecovery struct {
	fault chaosFault
	after time.Duration
	ok    bool // some job succeeded after the fault's end
}

// chaosSummary is a chaos run reduced to its figures.
type chaosSummary struct {
	n, accepted, replayed, gaveUp int
	statuses                      map[string]int // final status of the accepted jobs ("missing" too)
	succeeded                     int
	// missing: accepted, no row with that ID. wrongID: the row stored under the job's key has
	// another ID than the one the client was given.
	missing, wrongID int
	// nonTerminalAtGrace: accepted, stored, not terminal at the grace deadline.
	nonTerminalAtGrace int
	// extraRows: rows beyond one per job (by key or prompt); extraResults: stored results
	// beyond one per job; noResult: succeeded rows without a result; orphans: rows of no
	// accepted submit.
	extraRows, extraResults, noResult, orphans int
	callsMax                                   int
	callsMean                                  float64
	calls, aborted, tooMany, paidTwice         int
	recordedAttempts                           int
	afterSuccess                               []string
	answers                                    map[int]int // HTTP status → count over every submit try; 0: no answer
	noRetryAfter                               int         // 503s without Retry-After
	recoveries                                 []chaosRecovery
	lastTerminal                               time.Duration // latest finished_at among accepted jobs, since start
}

// lost are the lost jobs: accepted, then missing or not terminal at the deadline.
func (s chaosSummary) lost() int { return s.missing + s.nonTerminalAtGrace }

func summarizeChaos(r chaosResult) chaosSummary {
	s := chaosSummary{n: len(r.submits), statuses: map[string]int{}, answers: map[int]int{}}
	byID := map[string]chaosRow{}
	rowsByKey := map[string][]chaosRow{}
	rowsByPrompt := map[string][]chaosRow{}
	for _, row := range r.rows {
		byID[row.id] = row
		if row.key != "" {
			rowsByKey[row.key] = append(rowsByKey[row.key], row)
		}
		rowsByPrompt[row.prompt] = append(rowsByPrompt[row.prompt], row)
	}
	callsByJob := map[int][]chaosCall{}
	for _, c := range r.calls {
		callsByJob[c.job] = append(callsByJob[c.job], c)
		s.calls++
		switch c.status {
		case http.StatusTooManyRequests:
			s.tooMany++
		case llmsim.StatusClientClosed:
			s.aborted++
		}
	}
	known := map[string]bool{}
	totalCalls := 0
	for i, sub := range r.submits {
		for _, a := range sub.answers {
			s.answers[a.status]++
			if a.status == http.StatusServiceUnavailable && strings.TrimSpace(a.retryAfter) == "" {
				s.noRetryAfter++
			}
		}
		if !sub.accepted {
			s.gaveUp++
			continue
		}
		s.accepted++
		known[sub.id] = true
		if sub.replayed {
			s.replayed++
		}
		prompt := chaosMarker(r.tag, i)
		keyRows, promptRows := rowsByKey[sub.key], rowsByPrompt[prompt]
		s.extraRows += max(0, len(keyRows)-1, len(promptRows)-1)
		results := 0
		for _, row := range promptRows {
			if row.hasResult {
				results++
			}
		}
		s.extraResults += max(0, results-1)
		if len(keyRows) > 0 && !slices.ContainsFunc(keyRows, func(row chaosRow) bool { return row.id == sub.id }) {
			s.wrongID++
		}
		calls := callsByJob[i]
		totalCalls += len(calls)
		s.callsMax = max(s.callsMax, len(calls))
		ok200 := 0
		for _, c := range calls {
			if c.status == http.StatusOK {
				ok200++
			}
		}
		if ok200 > 1 {
			s.paidTwice++
		}
		row, found := byID[sub.id]
		if !found {
			s.missing++
			s.statuses["missing"]++
			continue
		}
		s.statuses[row.status]++
		s.recordedAttempts += row.recorded
		if row.finishedAt != nil {
			s.lastTerminal = max(s.lastTerminal, row.finishedAt.Sub(r.start))
		}
		if row.status != "succeeded" {
			continue
		}
		s.succeeded++
		if !row.hasResult {
			s.noResult++
		}
		if row.finishedAt == nil {
			continue
		}
		for _, c := range calls {
			if c.arrived.After(*row.finishedAt) {
				s.afterSuccess = append(s.afterSuccess, fmt.Sprintf("job %d (%s) succeeded at %.3f s, called again at %.3f s (answer %d)",
					i, sub.id, row.finishedAt.Sub(r.start).Seconds(), c.arrived.Sub(r.start).Seconds(), c.status))
			}
		}
	}
	if s.accepted > 0 {
		s.callsMean = float64(totalCalls) / float64(s.accepted)
	}
	for _, row := range r.rows {
		if !known[row.id] {
			s.orphans++
		}
	}
	for _, id := range r.pending {
		if _, found := byID[id]; known[id] && found {
			s.nonTerminalAtGrace++
		}
	}
	var successes []time.Duration
	for _, row := range r.rows {
		if row.status == "succeeded" && row.finishedAt != nil {
			successes = append(successes, row.finishedAt.Sub(r.start))
		}
	}
	slices.Sort(successes)
	for _, f := range r.faults {
		rec := chaosRecovery{fault: f}
		if k, _ := slices.BinarySearch(successes, f.end+1); k < len(successes) {
			rec.after, rec.ok = successes[k]-f.end, true
		}
		s.recoveries = append(s.recoveries, rec)
	}
	return s
}

// chaosCheck is one line of the table.
type chaosCheck struct {
	measure, value, target string
	judged, pass           bool
}

func (c chaosCheck) verdict() string {
	switch {
	case !c.judged:
		return ""
	case c.pass:
		return "PASS"
	}
	return "FAIL"
}

// chaosChecks are the table's lines for run r of opts o.
func chaosChecks(o chaosOpts, r chaosResult, s chaosSummary) []chaosCheck {
	other := []string{}
	for _, st := range slices.Sorted(maps.Keys(s.statuses)) {
		if st != "succeeded" {
			other = append(other, fmt.Sprintf("%s %d", st, s.statuses[st]))
		}
	}
	succeeded := fmt.Sprint(s.succeeded)
	if len(other) > 0 {
		succeeded += " (" + strings.Join(other, ", ") + ")"
	}
	var answers []string
	for _, st := range slices.Sorted(maps.Keys(s.answers)) {
		name := fmt.Sprint(st)
		if st == 0 {
			name = "no answer"
		}
		answers = append(answers, fmt.Sprintf("%s×%d", name, s.answers[st]))
	}
	graceLabel := "last fault + " + seconds(o.grace)
	checks := []chaosCheck{
		{measure: "jobs accepted (202, or 200 replaying an earlier try)", value: fmt.Sprintf("%d/%d (%d by replay)", s.accepted, s.n, s.replayed),
			target: "all", judged: true, pass: s.accepted == s.n},
		{measure: "jobs succeeded", value: succeeded},
		{measure: "lost jobs (accepted, then missing, or not terminal at " + graceLabel + ")",
			value:  fmt.Sprintf("%d (missing %d, not terminal %d)", s.lost(), s.missing, s.nonTerminalAtGrace),
			target: "0", judged: true, pass: s.lost() == 0},
		{measure: "duplicate results (extra job rows or stored results for one job)", value: fmt.Sprint(s.extraRows + s.extraResults),
			target: "0", judged: true, pass: s.extraRows+s.extraResults == 0},
		{measure: "succeeded jobs without a stored result", value: fmt.Sprint(s.noResult), target: "0", judged: true, pass: s.noResult == 0},
		{measure: "provider calls per job: max / mean", value: fmt.Sprintf("%d / %.2f", s.callsMax, s.callsMean)},
		{measure: "provider calls arriving after the job's finished_at (succeeded jobs)", value: fmt.Sprint(len(s.afterSuccess)),
			target: "0", judged: true, pass: len(s.afterSuccess) == 0},
		{measure: "submit answers (every try)", value: strings.Join(answers, ", ")},
		{measure: "500 answers", value: fmt.Sprint(s.answers[http.StatusInternalServerError]), target: "0", judged: true,
			pass: s.answers[http.StatusInternalServerError] == 0},
		{measure: "503 answers without Retry-After", value: fmt.Sprint(s.noRetryAfter), target: "0", judged: true, pass: s.noRetryAfter == 0},
		{measure: "202/200 naming a job not in the database", value: fmt.Sprint(s.missing + s.wrongID), target: "0", judged: true,
			pass: s.missing+s.wrongID == 0},
	}
	for _, rec := range s.recoveries {
		f := rec.fault
		when := fmt.Sprintf("%.1f s", f.start.Seconds())
		if f.end-f.start >= 100*time.Millisecond {
			when = fmt.Sprintf("%.1f–%.1f s", f.start.Seconds(), f.end.Seconds())
		}
		value := "no success after it"
		if f.err != nil {
			value = "fault not injected: " + f.err.Error()
		} else if rec.ok {
			value = seconds(rec.after)
		}
		checks = append(checks, chaosCheck{measure: fmt.Sprintf("recovery: %s at %s → next success", f.what, when), value: value})
	}
	allTerminal := chaosCheck{measure: "every accepted job terminal", target: "≤ " + graceLabel, judged: true}
	switch {
	case r.allTerminal:
		after := s.lastTerminal - r.lastFaultEnd
		allTerminal.value = fmt.Sprintf("last fault + %s", seconds(after))
		allTerminal.pass = s.nonTerminalAtGrace == 0
	default:
		allTerminal.value = fmt.Sprintf("%d still not terminal at last fault + %s", len(r.pending), seconds(r.observedUntil-r.lastFaultEnd))
	}
	checks = append(checks, allTerminal)
	return checks
}

// Markers of the chaos section in docs/benchmarks.md.
const (
	chaosBegin = "<!-- chaos:begin -->"
	chaosEnd   = "<!-- chaos:end -->"
)

// chaosReport is a finished chaos run.
type chaosReport struct {
	opts    chaosOpts
	res     chaosResult
	sum     chaosSummary
	command string
	date    time.Time
	machine string
}

var chaosHeader = []string{"measure", "value", "target", "result"}

func (r chaosReport) checks() []chaosCheck { return chaosChecks(r.opts, r.res, r.sum) }

// pass is the run's verdict: every judged line passes.
func (r chaosReport) pass() bool {
	for _, c := range r.checks() {
		if c.judged && !c.pass {
			return false
		}
	}
	return true
}

func (r chaosReport) rows() [][]string {
	var out [][]string
	for _, c := range r.checks() {
		out = append(out, []string{c.measure, c.value, c.target, c.verdict()})
	}
	return out
}

func (r chaosReport) verdict() string {
	if r.pass() {
		return "PASS"
	}
	return "FAIL"
}

// notes are the lines under the table.
func (r chaosReport) notes() []string {
	o, res, s := r.opts, r.res, r.sum
	notes := []string{
		fmt.Sprintf("Setup: %d jobs submitted over %s (one Idempotency-Key each), spread over %d api processes; %d worker processes; "+
			"the simulator answers after %s + U(0, %s) with a token bucket of %g refilling %g/s, and the credential's limit is configured "+
			"the same (llmq's defaults otherwise: worker concurrency 200, sweep interval 10 s). Each process runs under a supervisor "+
			"that restarts it %s after it exits on its own. Redis is a private redis-server without persistence; Postgres is "+
			"reached through an in-process TCP proxy.",
			o.n, o.submitOver, o.apis, o.workers, o.latency, o.jitter, o.capacity, o.rate, chaosRestartBackoff),
		fmt.Sprintf("Faults (times from the first submit): a random worker SIGKILLed every %s for %s and restarted at once; "+
			"FLUSHALL at %s; Postgres unreachable from %s for %s (the proxy cuts every connection and resets new ones). "+
			"The client retries 503 and 429 after their Retry-After plus U(0, %s), other 5xx and transport errors after %s, "+
			"with the same Idempotency-Key.",
			o.killEvery, o.killFor, o.flushAt, o.pgDownAt, o.pgDownFor, chaosRetrySpread, chaosTransportBackoff),
		"Provider calls are counted by the simulator (a marker in each prompt names the job), including calls whose worker was " +
			"killed before the answer; a call \"after the job's finished_at\" arrived at the simulator after the transaction that " +
			"stored the job's result had begun. Recovery is the time from a fault's end (the killed worker restarted, Postgres " +
			"reachable again) to the next job that succeeded (its finished_at).",
		fmt.Sprintf("Provider: %d calls with a job marker (%d answered 429, %d abandoned by their caller: a killed worker or a "+
			"canceled attempt), %d without; %d jobs were answered 200 more than once (at-least-once calls); job_attempts "+
			"recorded %d attempts.", s.calls, s.tooMany, s.aborted, res.unmarked, s.paidTwice, s.recordedAttempts),
	}
	if len(s.afterSuccess) > 0 {
		ex := s.afterSuccess[:min(5, len(s.afterSuccess))]
		notes = append(notes, "Calls after success: "+strings.Join(ex, "; ")+".")
	}
	if len(res.exits) > 0 {
		notes = append(notes, fmt.Sprintf("%d processes exited on their own and were restarted by the supervisor (their logs: -keep-logs).",
			len(res.exits)))
	}
	if s.orphans > 0 {
		notes = append(notes, fmt.Sprintf("%d job rows belong to no accepted submit (committed, but the client never got a 2xx).", s.orphans))
	}
	if s.gaveUp > 0 {
		var why []string
		for _, sub := range res.submits {
			if !sub.accepted && len(why) < 3 {
				why = append(why, sub.key+": "+sub.giveUp)
			}
		}
		notes = append(notes, fmt.Sprintf("%d submits were never accepted: %s.", s.gaveUp, strings.Join(why, "; ")))
	}
	notes = append(notes, "Verdict: "+r.verdict()+".")
	return notes
}

// text is what the command prints: the report and its verdict.
func (r chaosReport) text() string {
	return sectionText(chaosHeader, r.rows(), r.notes()) + "\n" + r.verdict() + "\n"
}

// markdown is the section written between the chaos markers.
func (r chaosReport) markdown() string {
	return sectionMarkdown("chaos: workers killed, Redis flushed and Postgres cut off while jobs run", r.command, r.date,
		r.machine, chaosHeader, r.rows(), r.notes())
}
