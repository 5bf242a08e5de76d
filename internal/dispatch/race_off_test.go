//go:build !race

package dispatch

// raceEnabled reports that the tests run under the race detector.
const raceEnabled = false
