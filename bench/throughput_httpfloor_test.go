package main

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/pgtest"
	"github.com/llmq/llmq/internal/redistest"
)

// The floor over HTTP is a real queue on the real stores: every job submitted over HTTP ends
// with the simulator's answer stored in its row, once.
func TestHTTPFloorSystem(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	o := tpOpts{shared: &shared{dbURL: pgtest.URL(t), redisURL: redistest.URL(), workers: 1}, conns: 4, clients: 4}
	sys := &httpFloorSystem{floorBase: floorBase{inProcessQueue: inProcessQueue{o: o}}}
	t.Cleanup(sys.close)
	const n = 6
	require.NoError(t, sys.prepare(ctx, n))
	m := sys.meter()
	m.start(ctx)
	since := time.Now()
	for i := range n {
		require.NoError(t, sys.submit(ctx, i))
	}
	require.Eventually(t, func() bool {
		done, err := sys.completed(ctx)
		return err == nil && done == n
	}, 30*time.Second, 10*time.Millisecond)
	out, err := sys.results(ctx, since)
	require.NoError(t, err)
	require.Len(t, out.lat, n)
	// The server's WAL since the meter's start holds at least each job's insert, update and
	// their commits (the position is the whole server's: tests beside this one only add to it).
	wal := m.wal(ctx)
	require.True(t, wal.ok, "the WAL position read at the meter's start and now")
	require.GreaterOrEqual(t, wal.bytes, int64(n*200), "a job's row (its request, then its answer) and two commits")

	var done, answered int
	require.NoError(t, sys.pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE status = 'done'),
	count(*) FILTER (WHERE result->>'type' = 'message' AND finished_at IS NOT NULL) FROM bench_jobs`).Scan(&done, &answered))
	require.Equal(t, n, done)
	require.Equal(t, n, answered, "each row holds the provider's answer")

	// A body the API cannot read is refused, not queued.
	resp, err := sys.hc.Post(sys.apiURL+"/jobs", "application/json", strings.NewReader(`{"i":99}`))
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusBadRequest, resp.StatusCode)
	// A duplicate submit is refused by the row's key: nothing is stored twice.
	require.ErrorContains(t, sys.submit(ctx, 0), "500")
}
