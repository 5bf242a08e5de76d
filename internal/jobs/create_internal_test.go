package jobs

import (
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestCreate_Allocs pins a keyless submit's Create (no admission), its statement run alone by
// the batcher on an idle connection whose plans are made: 59 allocations, most of them pgx's
// and the row's values. The statement's jobQuery and its arguments are one insertQuery, which
// holds the tenant, credential and timeout its arguments point at. Apart they were 2
// allocations, those three values boxed 3 more, and the check of a successful insert for an ID
// conflict (its errors.As target moved to the heap) 1 more: 64.
func TestCreate_Allocs(t *testing.T) { // not parallel: testing.AllocsPerRun
	if raceEnabled {
		t.Skip("the race detector's sync.Pool drops pgx's pooled buffers at random")
	}
	ctx, _, s, _ := scanSetup(t)
	p := CreateParams{Tenant: "acme", Credential: "c", Request: json.RawMessage(`{"model":"m"}`),
		MaxAttempts: 3, Timeout: time.Hour, Fallbacks: []string{"d"}}
	job, _, err := s.Create(ctx, p) // a connection made, and idle, its plans made
	require.NoError(t, err)
	allocs := testing.AllocsPerRun(100, func() {
		if _, _, err := s.Create(ctx, p); err != nil {
			panic(err)
		}
	})
	require.Equal(t, "acme", job.Tenant)
	require.Equal(t, "c", job.Credential)
	require.Equal(t, Duration(time.Hour), job.Timeout)
	t.Logf("Create: %.1f allocations", allocs)
	// 59 measured (64 before an insert's arguments shared its query's allocation); 2 of room for
	// what a pgx or Go upgrade moves, still below the 64.
	require.LessOrEqual(t, allocs, 61.0, "allocations per keyless Create")
}

// TestCreate_ConcurrentKeepTheirOwnValues: creates run at once, batched together, each store
// their own tenant, credential and timeout (which their statements' arguments point at), as a
// read of each job by its ID answers.
func TestCreate_ConcurrentKeepTheirOwnValues(t *testing.T) {
	t.Parallel()
	ctx, _, s, _ := scanSetup(t)
	const n = 16
	created := make([]*Job, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			created[i], _, errs[i] = s.Create(ctx, CreateParams{Tenant: fmt.Sprintf("tenant-%d", i),
				Credential: fmt.Sprintf("cred-%d", i), Request: json.RawMessage(`{"model":"m"}`), MaxAttempts: 3,
				Timeout: time.Duration(i+1) * time.Minute})
		})
	}
	wg.Wait()
	for i := range n {
		require.NoError(t, errs[i])
		got, err := s.Get(ctx, created[i].ID)
		require.NoError(t, err)
		for _, job := range []*Job{created[i], got} {
			require.Equal(t, fmt.Sprintf("tenant-%d", i), job.Tenant)
			require.Equal(t, fmt.Sprintf("cred-%d", i), job.Credential)
			require.Equal(t, Duration(time.Duration(i+1)*time.Minute), job.Timeout)
			require.WithinDuration(t, got.CreatedAt.Add(time.Duration(i+1)*time.Minute), job.Deadline, time.Second)
		}
	}
}
