//go:build race

package tokens_test

// raceEnabled reports that the tests run under the race detector, whose sync.Pool drops a share
// of what is put back at random (json.Valid's scanner is pooled): allocation counts then vary.
const raceEnabled = true
