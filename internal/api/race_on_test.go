//go:build race

package api

// raceEnabled reports that the tests run under the race detector, whose sync.Pool drops a share
// of what is put back at random: allocation counts then vary.
const raceEnabled = true
