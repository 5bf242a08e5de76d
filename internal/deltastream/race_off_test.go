//go:build !race

package deltastream

// raceEnabled reports that the tests run under the race detector.
const raceEnabled = false
