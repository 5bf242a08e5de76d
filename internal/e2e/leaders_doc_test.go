package e2e_test

import (
	"os"
	"path/filepath"
	"regexp"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestOperationsDoc_LeaderQueryNamesEachDuty: docs/operations.md gives operators a query that
// names the worker leading each duty. Run as written there, on the database of a worker that
// leads all three (a batch lane configured), it names the sweeper, maintenance and the batch
// lane once each, with the leader's address.
func TestOperationsDoc_LeaderQueryNamesEachDuty(t *testing.T) {
	t.Parallel()
	md, err := os.ReadFile(filepath.Join(repoRoot, "docs", "operations.md"))
	require.NoError(t, err)
	m := regexp.MustCompile("which worker leads each duty[^`]*`([^`]+)`").FindSubmatch(md)
	require.NotNil(t, m, "docs/operations.md no longer holds the query")
	query := "SELECT duty, count(*), bool_and(client_port IS NOT NULL) FROM (" + string(m[1]) + ") q " +
		"WHERE duty IS NOT NULL GROUP BY duty"

	b := setup(t, setupOpts{extra: "batch: { enabled: true }"})
	pool, err := openPool(b.ctx, b.dbURL)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	// leaders runs the query: how many leaders each duty has, each with its address.
	leaders := func() (map[string]int, error) {
		rows, err := pool.Query(b.ctx, query)
		if err != nil {
			return nil, err
		}
		defer rows.Close()
		got := map[string]int{}
		for rows.Next() {
			var duty string
			var n int
			var addressed bool
			if err := rows.Scan(&duty, &n, &addressed); err != nil {
				return nil, err
			}
			if !addressed {
				n = -n // no address: not what the doc promises
			}
			got[duty] = n
		}
		return got, rows.Err()
	}
	want := map[string]int{"sweeper": 1, "maintenance": 1, "batch lane": 1}
	require.Eventually(t, func() bool { // on testify's goroutine: no require here
		got, err := leaders()
		return err != nil || len(got) == len(want)
	}, 30*time.Second, 50*time.Millisecond, "the worker leads every duty within its first tries")
	got, err := leaders()
	require.NoError(t, err, "the query of docs/operations.md: %s", query)
	require.Equal(t, want, got, "duty: leaders (negative: without their address)")
}
