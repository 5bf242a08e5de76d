package main

import (
	"fmt"
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
