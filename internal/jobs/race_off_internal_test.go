//go:build !race

package jobs

// raceEnabled reports that the tests run under the race detector (see race_on_internal_test.go).
const raceEnabled = false
