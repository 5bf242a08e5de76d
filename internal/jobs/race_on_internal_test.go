//go:build race

package jobs

// raceEnabled reports that the tests run under the race detector, whose sync.Pool drops a share
// of what is put back at random (pgx pools its buffers): allocation counts then vary.
const raceEnabled = true
