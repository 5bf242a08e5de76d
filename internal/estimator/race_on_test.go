//go:build race

package estimator_test

// raceEnabled reports that the tests run under the race detector, whose sync.Pool drops a share
// of what is put back at random (tokens.Count's json.Valid scanner is pooled): allocation
// counts then vary.
const raceEnabled = true
