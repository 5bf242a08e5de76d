package main

import (
	"errors"
	"flag"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/llmq/llmq/internal/llmsim"
)

// outcome is what the benchmark saw of one job.
type outcome struct {
	// done: the job reached a final outcome (an answer, or its client gave up) before the row's
	// timeout. A job still waiting when the timeout hit is not done.
	done bool
	// ok: the final outcome is a successful answer.
	ok bool
	// latency is submit → final outcome, as the client saw it.
	latency time.Duration
	// at is the final outcome's time since the row's first submit.
	at time.Duration
}

// target is what a judged row must reach (the herd targets, for the llmq rows).
type target struct {
	// maxRatio bounds the last result's time as a multiple of the floor.
	maxRatio float64
	// exactRequests requires exactly one provider request per job.
	exactRequests bool
	// maxRequestsPerJob bounds provider requests / jobs (ignored with exactRequests).
	maxRequestsPerJob float64
	// no429 requires zero 429 answers.
	no429 bool
}

// The herd targets: with the provider's limit configured, the floor within 5 %, one request
// per job and no 429; with the limit learned from its headers, the floor within 15 % and at
// most 10 % more requests than jobs.
var (
	herdConfiguredTarget = target{maxRatio: 1.05, exactRequests: true, no429: true}
	herdLearnedTarget    = target{maxRatio: 1.15, maxRequestsPerJob: 1.10}
)

// describe renders the target for the notes under the table.
func (t target) describe(n int, floor time.Duration) string {
	parts := []string{fmt.Sprintf("%d/%d succeeded", n, n)}
	if floor > 0 {
		parts = append(parts, fmt.Sprintf("last result ≤ %.2f × floor (%s)", t.maxRatio, seconds(time.Duration(t.maxRatio*float64(floor)))))
	}
	if t.exactRequests {
		parts = append(parts, fmt.Sprintf("exactly %d provider requests", n))
	} else {
		parts = append(parts, fmt.Sprintf("≤ %d provider requests", int(math.Floor(t.maxRequestsPerJob*float64(n)+1e-9))))
	}
	if t.no429 {
		parts = append(parts, "0 429s")
	}
	return strings.Join(parts, ", ")
}

// misses returns why r misses the target; empty means it meets it. With a zero floor (n ≤
// capacity) the time is not judged.
func (t target) misses(r result, floor time.Duration) []string {
	var out []string
	if r.err != nil {
		first, _, _ := strings.Cut(r.err.Error(), "\n")
		return []string{"the row failed: " + first}
	}
	if r.succeeded != r.n {
		out = append(out, fmt.Sprintf("%d/%d succeeded", r.succeeded, r.n))
	}
	if floor > 0 {
		limit := time.Duration(t.maxRatio * float64(floor))
		if !r.complete || r.last > limit {
			out = append(out, fmt.Sprintf("last result %s > %s", lastText(r), seconds(limit)))
		}
	}
	if t.exactRequests && r.requests != r.n {
		out = append(out, fmt.Sprintf("%d provider requests ≠ %d", r.requests, r.n))
	}
	if !t.exactRequests {
		if limit := int(math.Floor(t.maxRequestsPerJob*float64(r.n) + 1e-9)); r.requests > limit {
			out = append(out, fmt.Sprintf("%d provider requests > %d", r.requests, limit))
		}
	}
	if t.no429 && r.tooMany != 0 {
		out = append(out, fmt.Sprintf("%d 429s > 0", r.tooMany))
	}
	return out
}

// result is one row of the table.
type result struct {
	name      string
	n         int
	succeeded int
	requests  int // provider requests, from the simulator
	tooMany   int // 429 answers, from the simulator
	p50, p95  time.Duration
	// last is the time of the last final outcome since the first submit; when !complete, the
	// row's timeout (some jobs had no outcome yet).
	last     time.Duration
	complete bool
	// target is nil for rows that have none.
	target *target
	// err is set when the row could not run; the other fields are then meaningless.
	err error
	// note is printed under the table (a row-specific caveat).
	note string
}

// summarize builds a row from the outcomes of n jobs and the simulator's counters. timeout is
// reported as the last result when some job had no final outcome.
func summarize(name string, outs []outcome, st llmsim.Stats, timeout time.Duration) result {
	r := result{name: name, n: len(outs), requests: st.Requests, tooMany: st.ByStatus[429], complete: true}
	var lat []time.Duration
	for _, o := range outs {
		if !o.done {
			r.complete = false
			continue
		}
		r.last = max(r.last, o.at)
		if o.ok {
			r.succeeded++
			lat = append(lat, o.latency)
		}
	}
	if !r.complete {
		r.last = timeout
	}
	r.p50 = percentile(lat, 50)
	r.p95 = percentile(lat, 95)
	return r
}

// percentile returns the nearest-rank p-th percentile (0 < p ≤ 100) of ds, or 0 for none. ds
// is not modified.
func percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	rank := int(math.Ceil(p / 100 * float64(len(s))))
	return s[min(max(rank, 1), len(s))-1]
}

// floorOf is the theoretical best time for n requests against a full bucket: capacity at once,
// the rest at the refill rate. Zero when the bucket holds them all.
func floorOf(n int, capacity, rate float64) time.Duration {
	if float64(n) <= capacity || rate <= 0 {
		return 0
	}
	return time.Duration((float64(n) - capacity) / rate * float64(time.Second))
}

// seconds renders a duration as "8.03 s".
func seconds(d time.Duration) string { return fmt.Sprintf("%.2f s", d.Seconds()) }

func lastText(r result) string {
	if !r.complete {
		return "> " + seconds(r.last)
	}
	return seconds(r.last)
}

// verdict is the target column: PASS, FAIL or empty for rows without a target.
func verdict(r result, floor time.Duration) string {
	switch {
	case r.target == nil:
		return ""
	case len(r.target.misses(r, floor)) == 0:
		return "PASS"
	}
	return "FAIL"
}

var tableHeader = []string{"strategy", "succeeded", "provider requests", "429s", "requests/success", "p50", "p95", "last result", "× floor", "target"}

// cells renders a row's columns (tableHeader order).
func cells(r result, floor time.Duration) []string {
	if r.err != nil {
		return []string{r.name, "error", "", "", "", "", "", "", "", verdict(r, floor)}
	}
	perSuccess, p50, p95 := "n/a", "n/a", "n/a"
	if r.succeeded > 0 {
		perSuccess = fmt.Sprintf("%.2f", float64(r.requests)/float64(r.succeeded))
		p50, p95 = seconds(r.p50), seconds(r.p95)
	}
	ratio := "n/a"
	if floor > 0 {
		ratio = fmt.Sprintf("%.2f", r.last.Seconds()/floor.Seconds())
		if !r.complete {
			ratio = "> " + ratio
		}
	}
	return []string{
		r.name,
		fmt.Sprintf("%d/%d", r.succeeded, r.n),
		fmt.Sprint(r.requests),
		fmt.Sprint(r.tooMany),
		perSuccess, p50, p95, lastText(r), ratio, verdict(r, floor),
	}
}

// textTable aligns rows under header: the first column left-aligned, the others right-aligned,
// columns separated by two spaces, trailing spaces trimmed.
func textTable(header []string, rows [][]string) string {
	width := make([]int, len(header))
	for _, row := range append([][]string{header}, rows...) {
		for i, c := range row {
			width[i] = max(width[i], len([]rune(c)))
		}
	}
	var b strings.Builder
	line := func(row []string) {
		var l strings.Builder
		for i, c := range row {
			pad := strings.Repeat(" ", width[i]-len([]rune(c)))
			if i > 0 {
				l.WriteString("  ")
			}
			if i == 0 {
				l.WriteString(c + pad)
			} else {
				l.WriteString(pad + c)
			}
		}
		b.WriteString(strings.TrimRight(l.String(), " ") + "\n")
	}
	line(header)
	rule := make([]string, len(header))
	for i := range rule {
		rule[i] = strings.Repeat("-", width[i])
	}
	line(rule)
	for _, row := range rows {
		line(row)
	}
	return b.String()
}

// markdownTable renders rows as a GitHub Markdown table, numbers right-aligned. Pipes in cells
// are escaped.
func markdownTable(header []string, rows [][]string) string {
	var b strings.Builder
	esc := func(row []string) string {
		out := make([]string, len(row))
		for i, c := range row {
			out[i] = strings.ReplaceAll(c, "|", `\|`)
		}
		return "| " + strings.Join(out, " | ") + " |\n"
	}
	b.WriteString(esc(header))
	align := make([]string, len(header))
	for i := range align {
		align[i] = "---:"
	}
	align[0] = "---"
	b.WriteString("|" + strings.Join(align, "|") + "|\n")
	for _, row := range rows {
		b.WriteString(esc(row))
	}
	return b.String()
}

// errNoEndMarker is returned by replaceSection for a begin marker without an end marker after it.
var errNoEndMarker = errors.New("begin marker without an end marker after it")

// replaceSection returns doc with the text between the begin and end markers replaced by body
// (the markers are kept, each on its own line). Without the begin marker, the section is
// appended at the end of doc. An end marker missing after the begin marker is an error.
func replaceSection(doc, begin, end, body string) (string, error) {
	if !strings.HasSuffix(body, "\n") {
		body += "\n"
	}
	section := begin + "\n" + body + end
	i := strings.Index(doc, begin)
	if i < 0 {
		if doc != "" && !strings.HasSuffix(doc, "\n") {
			doc += "\n"
		}
		if doc != "" {
			doc += "\n"
		}
		return doc + section + "\n", nil
	}
	j := strings.Index(doc[i+len(begin):], end)
	if j < 0 {
		return "", fmt.Errorf("replace section %s: %w", begin, errNoEndMarker)
	}
	return doc[:i] + section + doc[i+len(begin)+j+len(end):], nil
}

// sectionText renders a scenario's report for the terminal: its table, then its notes.
func sectionText(header []string, rows [][]string, notes []string) string {
	return "\n" + textTable(header, rows) + "\n" + bullets(notes)
}

// sectionMarkdown renders a scenario's section of docs/benchmarks.md: its title, the command
// that made it with the date and machine, its table, then its notes.
func sectionMarkdown(title, command string, date time.Time, machine string, header []string, rows [][]string, notes []string) string {
	return "## " + title + "\n\n" +
		fmt.Sprintf("`%s` — %s, %s.\n\n", strings.TrimSpace(command), date.Format("2006-01-02"), machine) +
		markdownTable(header, rows) + "\n" + bullets(notes)
}

// parseFlags parses a scenario's arguments: flags only, so a stray argument is an error.
func parseFlags(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments: %s", strings.Join(fs.Args(), " "))
	}
	return nil
}

// bullets renders notes as a Markdown list, one "- " line each.
func bullets(notes []string) string {
	var b strings.Builder
	for _, n := range notes {
		b.WriteString("- " + n + "\n")
	}
	return b.String()
}
