package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// A change's effect is measured against the build before it in one invocation (`bench rate` or
// `bench throughput` with -baseline-bin DIR): each llmq layout runs with this build's binaries and with DIR's, in pairs
// whose two runs are back to back and whose order is swapped from one pair to the next (the run
// after another pays for what that one left behind), and the change is judged by the median of
// the pairs' ratios, which on this shared machine hold where single runs drift.

// baselineSuffix marks the rows run with the baseline build's binaries.
const baselineSuffix = " (baseline build)"

// baselineFlag registers -baseline-bin on fs, into dir, checked before anything runs.
func baselineFlag(fs *flagSet, dir *string) {
	fs.StringVar(dir, "baseline-bin", "", "directory of another build's api, worker and llmq binaries: each llmq "+
		"layout also runs with them, in pairs with this build whose order alternates (an even -runs: each build first as often), "+
		"compared by the median of the pairs' ratios (empty: none)")
	fs.check(func() error {
		if *dir == "" {
			return nil
		}
		return checkBaselineBin(*dir)
	})
}

// comparing reports whether a -baseline-bin comparison applies to system id.
func comparing(baseBin, id string) bool { return baseBin != "" && (id == tpLLMQ || id == tpServe) }

// runBaseline runs the baseline build's side of a pair (see pairRuns): measure with o's binaries
// taken from baseBin, and the result marked.
func runBaseline(baseBin string, o tpOpts, run func(tpOpts) tpResult) tpResult {
	res := run(o.withBin(baseBin))
	res.name += baselineSuffix
	res.baseline = true
	return res
}

// checkBaselineBin reports a directory that lacks a binary the llmq layouts run.
func checkBaselineBin(dir string) error {
	for _, name := range []string{"api", "worker", "llmq"} {
		if _, err := os.Stat(filepath.Join(dir, name)); err != nil {
			return fmt.Errorf("-baseline-bin: no %s binary in %s (build one with go build -o %s/ ./cmd/api ./cmd/worker ./cmd/llmq)",
				name, dir, dir)
		}
	}
	return nil
}

// withBin is o with the llmq binaries taken from bin.
func (o tpOpts) withBin(bin string) tpOpts {
	s := *o.shared
	s.bin = bin
	o.shared = &s
	return o
}

// pairRuns runs pair k's two runs back to back, this build's first in even pairs and the
// baseline's first in odd ones.
func pairRuns(k int, this, base func() tpResult) (tpResult, tpResult) {
	if k%2 == 1 {
		b := base()
		return this(), b
	}
	t := this()
	return t, base()
}

// side is baselineSuffix for a run of the baseline build, "" for this build's.
func (r tpResult) side() string {
	if r.baseline {
		return baselineSuffix
	}
	return ""
}

// newComparison pairs a system's runs of this build with the baseline's, run k with run k.
func newComparison(name string, rate float64, measures []pairRatio, this, base []tpResult) buildComparison {
	c := buildComparison{rate: rate, name: name, measures: measures}
	for k := range min(len(this), len(base)) {
		c.pairs = append(c.pairs, buildPair{this: this[k], base: base[k]})
	}
	return c
}

// buildPair is one pair of runs of a system: this build's and the baseline build's.
type buildPair struct{ this, base tpResult }

// buildComparison is a system's pairs (at one rate, for bench rate), compared on measures.
type buildComparison struct {
	rate     float64 // 0: not at a fixed rate
	name     string
	pairs    []buildPair
	measures []pairRatio
}

// pairRatio is one measure of this build ÷ the baseline's, per pair.
type pairRatio struct {
	what string
	of   func(tpResult) (float64, bool)
}

// The measures compared. At a fixed rate: CPU per job (every group), submit → result p50, and
// the attempt's start → its result p50 (the part after the pick-up, whose poll is noisy). As
// fast as it goes: jobs/s and CPU per job.
var (
	cpuPerJob    = pairRatio{"CPU per job", func(r tpResult) (float64, bool) { v := r.cpuTotalPer1000(); return v, v > 0 }}
	rateMeasures = []pairRatio{
		cpuPerJob,
		{"submit → result p50", func(r tpResult) (float64, bool) { return durationOf(r.lat) }},
		{"started → finished p50", func(r tpResult) (float64, bool) { return durationOf(r.fromStart) }},
	}
	throughputMeasures = []pairRatio{
		{"jobs/s", func(r tpResult) (float64, bool) { v := r.jobsPerSecond(); return v, v > 0 }},
		cpuPerJob,
	}
)

// durationOf is the p50 of ds; false when there is none.
func durationOf(ds []time.Duration) (float64, bool) {
	if len(ds) == 0 {
		return 0, false
	}
	return float64(percentile(ds, 50)), true
}

// note says, for each measure, the median of the pairs' ratios and each pair's ("" when no pair
// has both runs).
func (c buildComparison) note() string {
	var parts []string
	n := 0
	for _, m := range c.measures {
		var ratios []float64
		for _, p := range c.pairs {
			if p.this.err != nil || p.base.err != nil {
				continue
			}
			a, okA := m.of(p.this)
			b, okB := m.of(p.base)
			if okA && okB && b > 0 {
				ratios = append(ratios, a/b)
			}
		}
		if len(ratios) == 0 {
			continue
		}
		n = max(n, len(ratios))
		parts = append(parts, fmt.Sprintf("%s %.2f (%s)", m.what, median(ratios), pairRatiosText(ratios)))
	}
	if len(parts) == 0 {
		return ""
	}
	at := ""
	if c.rate > 0 {
		at = fmt.Sprintf(" at %g/s", c.rate)
	}
	return fmt.Sprintf("%s%s, this build ÷ the baseline build, median of %d order-swapped pairs (each pair's): %s.",
		c.name, at, n, strings.Join(parts, ", "))
}
