package main

import (
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strings"
	"time"
)

// checks are the lines of the chaos table: the measures, judged against the chaos targets
// where they have one.
func (c *chaos) checks(s chaosSummary) []check {
	r := c.res
	var other []string
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
	zero := func(what string, n int) check {
		return check{what: what, got: fmt.Sprint(n), target: "0", pass: n == 0}
	}
	grace := "last fault + " + seconds(c.grace)
	cs := []check{
		{what: "jobs accepted (202, or 200 replaying an earlier try)", got: fmt.Sprintf("%d/%d (%d by replay)", s.accepted, s.n, s.replayed),
			target: "all", pass: s.accepted == s.n},
		{what: "jobs succeeded", got: succeeded},
		{what: "lost jobs (accepted, then missing, or not terminal at " + grace + ")",
			got:    fmt.Sprintf("%d (missing %d, not terminal %d)", s.lost(), s.missing, s.nonTerminalAtGrace),
			target: "0", pass: s.lost() == 0},
		zero("duplicate results (extra job rows or stored results for one job)", s.extraRows+s.extraResults),
		zero("succeeded jobs without a stored result", s.noResult),
		{what: "provider calls per job: max / mean", got: fmt.Sprintf("%d / %.2f", s.callsMax, s.callsMean)},
		zero("provider calls arriving after the job's finished_at (succeeded jobs)", len(s.afterSuccess)),
		{what: "submit answers (every try)", got: strings.Join(answers, ", ")},
		zero("500 answers", s.answers[http.StatusInternalServerError]),
		zero("503 answers without Retry-After", s.noRetryAfter),
		zero("202/200 naming a job not in the database", s.missing+s.wrongID),
	}
	for _, rec := range s.recoveries {
		f := rec.fault
		when := fmt.Sprintf("%.1f s", f.start.Seconds())
		if f.end-f.start >= 100*time.Millisecond {
			when = fmt.Sprintf("%.1f–%.1f s", f.start.Seconds(), f.end.Seconds())
		}
		got := "no success after it"
		if f.err != nil {
			got = "fault not injected: " + f.err.Error()
		} else if rec.ok {
			got = seconds(rec.after)
		}
		cs = append(cs, check{what: fmt.Sprintf("recovery: %s at %s → next success", f.what, when), got: got})
	}
	all := check{what: "every accepted job terminal", target: "≤ " + grace}
	if r.allTerminal {
		all.got, all.pass = "last fault + "+seconds(s.lastTerminal-r.lastFaultEnd), s.nonTerminalAtGrace == 0
	} else {
		all.got = fmt.Sprintf("%d still not terminal at last fault + %s", len(r.pending), seconds(r.observedUntil-r.lastFaultEnd))
	}
	return append(cs, all)
}

// chaosHeader is the header of the chaos table.
var chaosHeader = []string{"measure", "value", "target", "result"}

func (c *chaos) report() report {
	s := summarizeChaos(c.res)
	cs := c.checks(s)
	rows := make([][]string, len(cs))
	for i, ch := range cs {
		rows[i] = []string{ch.what, ch.got, ch.target, verdict([]check{ch})}
	}
	notes := []string{
		fmt.Sprintf("%d jobs over %s to %d api processes, %d workers; the simulator answers after %s + U(0, %s), its bucket %g "+
			"refilling %g/s, the credential's limit the same. Faults: a random worker SIGKILLed every %s for %s, FLUSHALL at %s, "+
			"Postgres unreachable from %s for %s.", c.s.n, c.submitOver, c.apis, c.s.workers, c.latency, c.jitter, c.s.capacity,
			c.s.rate, c.killEvery, c.killFor, c.flushAt, c.pgDownAt, c.pgDownFor),
		fmt.Sprintf("Provider: %d calls with a job marker (%d answered 429, %d abandoned by their caller), %d without; %d jobs "+
			"answered 200 more than once; job_attempts recorded %d attempts.", s.calls, s.tooMany, s.aborted, c.res.unmarked,
			s.paidTwice, s.recordedAttempts),
	}
	if len(s.afterSuccess) > 0 {
		notes = append(notes, "Calls after success: "+strings.Join(s.afterSuccess[:min(5, len(s.afterSuccess))], "; ")+".")
	}
	if len(c.res.exits) > 0 {
		notes = append(notes, fmt.Sprintf("%d processes exited on their own and were restarted by the supervisor (logs: -keep-logs).",
			len(c.res.exits)))
	}
	if s.orphans > 0 {
		notes = append(notes, fmt.Sprintf("%d job rows belong to no accepted submit (committed, but the client never got a 2xx).", s.orphans))
	}
	if s.gaveUp > 0 {
		var why []string
		for _, sub := range c.res.submits {
			if !sub.accepted && len(why) < 3 {
				why = append(why, sub.key+": "+sub.giveUp)
			}
		}
		notes = append(notes, fmt.Sprintf("%d submits were never accepted: %s.", s.gaveUp, strings.Join(why, "; ")))
	}
	return report{tables: []table{{chaosHeader, rows}}, notes: append(notes, "Verdict: "+passText(verdict(cs) == "PASS")+".")}
}
