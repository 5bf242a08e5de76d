//go:build !race

package api

// raceEnabled reports that the tests run under the race detector (see race_on_test.go).
const raceEnabled = false
