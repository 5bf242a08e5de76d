//go:build race

package pgwait_test

// raceEnabled reports that the tests run under the race detector, whose instrumentation may
// change what escapes: allocation counts then vary.
const raceEnabled = true
