//go:build race

package deltastream

// raceEnabled reports that the tests run under the race detector, whose sync.Pool drops a share
// of what is put back at random (go-redis pools its readers and writers): allocation counts then
// vary.
const raceEnabled = true
