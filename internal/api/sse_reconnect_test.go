package api

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/jobs"
)

// killListener ends the Listener's Postgres session and waits until it has listened again and
// signalled every subscriber (its catch-up), so that each stream holds its signal.
func (b *testBundle) killListener(t *testing.T) {
	t.Helper()
	probe, unsubscribe := b.listener.Subscribe("probe") // no job: always signalled 0
	defer unsubscribe()
	var killed int
	require.NoError(t, b.pool.QueryRow(context.Background(), `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
		WHERE datname = current_database() AND pid <> pg_backend_pid()
		AND (query LIKE 'LISTEN%' OR query = '-- ping' OR query LIKE '%FROM jobs WHERE id = ANY%')`).Scan(&killed))
	require.Equal(t, 1, killed, "the Listener's session")
	select {
	case v := <-probe:
		require.Equal(t, 0, v)
	case <-time.After(30 * time.Second):
		t.Fatal("the Listener did not reconnect within 30s")
	}
	b.listener.Subscribers() // the catch-up signals every subscriber under the lock this takes
}

// TestEvents_ListenerReconnectReadsOnlyMovedJobs: after the Listener reconnects, a stream whose
// job did not move meanwhile reads nothing; one whose job moved reads and sends what it missed.
// Each stream read the job's events and the job before (a herd of two statements per stream,
// 20,000 for 10,000 streams, on a Postgres just back); the Listener now reads every followed
// job's latest event number itself, one statement per 1,000 jobs.
func TestEvents_ListenerReconnectReadsOnlyMovedJobs(t *testing.T) {
	t.Parallel()

	t.Run("Idle", func(t *testing.T) {
		t.Parallel()
		b, job, s, ticks, queries := tickedStream(t, setupOpts{})

		before := queries.n.Load()
		b.killListener(t)
		// The stream takes the keep-alive once it has handled the catch-up's signal (it was
		// waiting for either when the signal came).
		keepAlive(t, ticks, s)
		require.Equal(t, int64(2), queries.n.Load()-before, "the Listener's catch-up and the keep-alive's watch: the stream read nothing")

		// Signals flow again.
		b.attempt(t, job.ID, jobs.Outcome{Status: jobs.StatusSucceeded})
		require.Equal(t, []string{"running/2", "succeeded/3"}, names(s.rest(t)))
	})

	t.Run("Moved", func(t *testing.T) {
		t.Parallel()
		b, job, s, _, _ := tickedStream(t, setupOpts{}) // no tick sent: only the reconnect may tell the stream

		// A transition no notification announces (as while the Listener is away): its watch
		// lapsed.
		_, err := b.pool.Exec(context.Background(), `DELETE FROM job_watches WHERE job_id = $1`, job.ID)
		require.NoError(t, err)
		_, err = b.store.BeginAttempt(context.Background(), job.ID)
		require.NoError(t, err)

		b.killListener(t)
		require.Equal(t, "running/2", names([]sseFrame{s.nextEvent(t)})[0])
	})
}
