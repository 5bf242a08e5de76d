package api

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestContract_ParseAllocs pins the allocations of a minimal submit's parse (every submit's):
// its body's decode (the walk's request and the names it checks) and nothing for the job's
// parameters, which are returned by value. parseLimits kept a pointer into them beside the
// name its refusal quotes, which moved them to the heap at every parse: 1 more.
func TestContract_ParseAllocs(t *testing.T) { // not parallel: testing.AllocsPerRun
	if raceEnabled {
		t.Skip("allocations are counted without the race detector")
	}
	s := newContract(SubmitConfig{Credentials: []string{"default"}})
	body := []byte(minimalSubmit)
	p, err := s.parse("acme", nil, "", body)
	require.NoError(t, err)
	require.Equal(t, "default", p.Credential)
	allocs := testing.AllocsPerRun(200, func() {
		if _, err := s.parse("acme", nil, "", body); err != nil {
			panic(err)
		}
	})
	t.Logf("parse: %.1f allocations", allocs)
	require.LessOrEqual(t, allocs, 0.0, "allocations per parse of a minimal submit")
}
