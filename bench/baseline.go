package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// A change's effect is measured against the build before it in one invocation (`bench rate
// -baseline-bin DIR`): each llmq layout runs with this build's binaries and with DIR's, in pairs
// whose two runs are back to back and whose order is swapped from one pair to the next (the run
// after another pays for what that one left behind), and the change is judged by the median of
// the pairs' ratios, which on this shared machine hold where single runs drift.

// baselineSuffix marks the rows run with the baseline build's binaries.
const baselineSuffix = " (baseline build)"

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

// buildPair is one pair of runs of a system at a rate: this build's and the baseline build's.
type buildPair struct{ this, base tpResult }

// buildComparison is a system's pairs at one rate.
type buildComparison struct {
	rate  float64
	name  string
	pairs []buildPair
}

// pairRatio is one measure of this build ÷ the baseline's, per pair.
type pairRatio struct {
	what string
	of   func(tpResult) (float64, bool)
}

// pairRatios are the measures compared: CPU per job (every group), submit → result p50, and
// the attempt's start → its result p50 (the part after the pick-up, whose poll is noisy).
var pairRatios = []pairRatio{
	{"CPU per job", func(r tpResult) (float64, bool) { v := r.cpuTotalPer1000(); return v, v > 0 }},
	{"submit → result p50", func(r tpResult) (float64, bool) { return durationOf(r.lat) }},
	{"started → finished p50", func(r tpResult) (float64, bool) { return durationOf(r.fromStart) }},
}

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
	for _, m := range pairRatios {
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
	return fmt.Sprintf("%s at %g/s, this build ÷ the baseline build, median of %d order-swapped pairs (each pair's): %s.",
		c.name, c.rate, n, strings.Join(parts, ", "))
}
