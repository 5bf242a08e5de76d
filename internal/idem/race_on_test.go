//go:build race

package idem

// raceEnabled reports that the tests run under the race detector, whose instrumentation the
// allocation counts are not pinned for.
const raceEnabled = true
