package main

import (
	"fmt"
	"os"
	"runtime"
	"strings"
	"time"
)

// report is what a scenario measured, judged and rendered: its tables, the notes under them,
// and the rows that could not run.
type report struct {
	tables []table
	notes  []string
	failed []string // ids of rows that could not run: the report is printed, not written
}

// table is a header and its rows.
type table struct {
	header []string
	rows   [][]string
}

// text renders the report for the terminal.
func (r report) text() string {
	var b strings.Builder
	for _, t := range r.tables {
		b.WriteString("\n" + textTable(t.header, t.rows))
	}
	return b.String() + "\n" + bullets(r.notes)
}

// markdown renders the report's section of docs/benchmarks.md: the line saying how and where
// it was made, its tables, then its notes.
func (r report) markdown(h head) string {
	var b strings.Builder
	b.WriteString(h.line() + "\n\n")
	for _, t := range r.tables {
		b.WriteString(markdownTable(t.header, t.rows) + "\n")
	}
	return b.String() + bullets(r.notes)
}

// bullets renders notes as a Markdown list, one "- " line each.
func bullets(notes []string) string {
	var b strings.Builder
	for _, n := range notes {
		b.WriteString("- " + n + "\n")
	}
	return b.String()
}

// head says how a report was made: the command, the day, the machine and its load.
type head struct {
	command string
	date    time.Time
	machine string
	load    string // the load average when the run started; "" when unknown
}

// newHead describes a run of scenario with args starting now on this machine.
func newHead(scenario string, args []string) head {
	h := head{command: strings.TrimSpace("go run . " + scenario + " " + strings.Join(args, " ")), date: time.Now(), machine: machine()}
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		h.load = loadAverage(string(b))
	}
	return h
}

func (h head) line() string {
	load := ""
	if h.load != "" {
		load = "; load average " + h.load + " at the start"
	}
	return fmt.Sprintf("`%s` — %s, %s%s.", h.command, h.date.Format("2006-01-02"), h.machine, load)
}

// machine describes this computer: OS/arch, nproc and the CPU model when /proc tells it.
func machine() string {
	s := fmt.Sprintf("%s/%s, nproc %d", runtime.GOOS, runtime.GOARCH, runtime.NumCPU())
	if data, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for line := range strings.SplitSeq(string(data), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				s += ", " + strings.TrimSpace(v)
				break
			}
		}
	}
	return s + ", " + runtime.Version()
}

// loadAverage returns the 1, 5 and 15 minute load averages from the text of /proc/loadavg, or "".
func loadAverage(procLoadavg string) string {
	f := strings.Fields(procLoadavg)
	if len(f) < 3 {
		return ""
	}
	return strings.Join(f[:3], ", ")
}

// check is one measured figure and, when judged, its target and whether it was met.
type check struct {
	what   string // what is measured: "429s"
	got    string // what was measured: "0"
	target string // "0", "≤ 8.40 s"; empty: shown, not judged
	pass   bool
}

// verdict is PASS when every judged check passed, FAIL when one did not, and "" when none is
// judged.
func verdict(cs []check) string {
	v := ""
	for _, c := range cs {
		switch {
		case c.target == "":
		case !c.pass:
			return "FAIL"
		default:
			v = "PASS"
		}
	}
	return v
}

// checksNote renders the judged checks of a row under its name: "llmq: succeeded 100/100
// (target 100/100), 429s 0 (target 0): PASS." A miss is named at the end.
func checksNote(name string, cs []check) string {
	var parts, missed []string
	for _, c := range cs {
		if c.target == "" {
			continue
		}
		parts = append(parts, fmt.Sprintf("%s %s (target %s)", c.what, c.got, c.target))
		if !c.pass {
			missed = append(missed, c.what)
		}
	}
	v := "PASS"
	if len(missed) > 0 {
		v = "FAIL (" + strings.Join(missed, ", ") + ")"
	}
	return fmt.Sprintf("%s: %s: %s.", name, strings.Join(parts, ", "), v)
}

// passText is PASS or FAIL.
func passText(ok bool) string {
	if ok {
		return "PASS"
	}
	return "FAIL"
}

// firstLine is the first line of err, for a note.
func firstLine(err error) string {
	first, _, _ := strings.Cut(err.Error(), "\n")
	return first
}
