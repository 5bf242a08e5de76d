package main

import (
	"fmt"
	"math"
	"net/http"
	"time"
)

// target is what a judged llmq row of a herd or tokens table must reach: every job succeeded,
// and the last result within maxRatio of the floor; as the row's own target says, exactly one
// provider request per job, no 429, and at most maxPerSuccess requests per succeeded job.
type target struct {
	maxRatio      float64
	exactRequests bool
	no429         bool
	maxPerSuccess float64 // 0: not judged
}

// checks judges r against t for a floor of floor (0: the time is not judged). A row that could
// not run fails.
func (t target) checks(r result, floor time.Duration) []check {
	if r.err != nil {
		return []check{{what: "run", got: "failed", target: "done", pass: false}}
	}
	cs := []check{{what: "succeeded", got: fmt.Sprintf("%d/%d", r.succeeded, r.n), target: fmt.Sprintf("%d/%d", r.n, r.n),
		pass: r.succeeded == r.n}}
	if floor > 0 {
		limit := time.Duration(math.Round(t.maxRatio * float64(floor))) // 1.15 × 24 s is 27.6 s, not a hair less
		cs = append(cs, check{what: "last result", got: r.lastText(),
			target: fmt.Sprintf("≤ %.2f × floor = %s", t.maxRatio, seconds(limit)), pass: r.complete && r.last <= limit})
	}
	if t.exactRequests {
		cs = append(cs, check{what: "provider requests", got: fmt.Sprint(r.requests()), target: fmt.Sprintf("= %d", r.n),
			pass: r.requests() == r.n})
	}
	if t.no429 {
		n := r.answered(http.StatusTooManyRequests)
		cs = append(cs, check{what: "429s", got: fmt.Sprint(n), target: "0", pass: n == 0})
	}
	if t.maxPerSuccess > 0 {
		ratio, ok := r.perSuccess()
		cs = append(cs, check{what: "requests per success", got: ratioText(ratio, ok), target: fmt.Sprintf("≤ %.1f", t.maxPerSuccess),
			pass: ok && ratio <= t.maxPerSuccess+1e-9})
	}
	return cs
}

// ratioText renders a ratio with two decimals, "n/a" when there is none.
func ratioText(v float64, ok bool) string {
	if !ok {
		return "n/a"
	}
	return fmt.Sprintf("%.2f", v)
}

// burstHeader is the header of the herd and tokens tables.
var burstHeader = []string{"strategy", "succeeded", "provider requests", "429s", "requests/success", "p50", "p95", "last result", "× floor", "target"}

// judge returns a row's checks; nil for a row that is not judged.
type judge func(result) []check

// targetJudge judges the rows that have a target against the floor.
func targetJudge(floor time.Duration) judge {
	return func(r result) []check {
		if r.target == nil {
			return nil
		}
		return r.target.checks(r, floor)
	}
}

// burstCells renders a row of the herd or tokens table (burstHeader's order).
func burstCells(r result, floor time.Duration, j judge) []string {
	v := verdict(j(r))
	if r.err != nil {
		return []string{r.name, "error", "", "", "", "", "", "", "", v}
	}
	p50, p95 := "n/a", "n/a"
	if r.succeeded > 0 {
		p50, p95 = seconds(r.p50), seconds(r.p95)
	}
	ratio := "n/a"
	if floor > 0 {
		ratio = fmt.Sprintf("%.2f", r.last.Seconds()/floor.Seconds())
		if !r.complete {
			ratio = "> " + ratio
		}
	}
	perSuccess, ok := r.perSuccess()
	return []string{r.name, fmt.Sprintf("%d/%d", r.succeeded, r.n), fmt.Sprint(r.requests()),
		fmt.Sprint(r.answered(http.StatusTooManyRequests)), ratioText(perSuccess, ok), p50, p95, r.lastText(), ratio, v}
}

// burstNotes are the notes every burst table ends with: each judged row against its targets,
// and the rows that failed. failed receives their ids.
func burstNotes(results []result, j judge) (notes, failed []string) {
	for _, r := range results {
		switch cs := j(r); {
		case r.err != nil:
			notes = append(notes, fmt.Sprintf("%s: failed: %s", r.name, firstLine(r.err)))
			failed = append(failed, r.id)
		case cs != nil:
			notes = append(notes, checksNote(r.name, cs))
		}
	}
	return notes, failed
}
