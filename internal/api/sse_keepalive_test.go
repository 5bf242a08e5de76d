package api

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/jobs"
)

// TestEvents_IdleKeepAliveCostsOneStatement: an idle stream's keep-alive renews its watch of the
// job, one statement, which also tells whether the job has an event the stream has not read; it
// reads the events and the job only then. Every keep-alive read them both before: three
// statements per idle stream every 15s, 2,000 a second for 10,000 idle streams of one replica.
func TestEvents_IdleKeepAliveCostsOneStatement(t *testing.T) {
	t.Parallel()

	t.Run("Idle", func(t *testing.T) {
		t.Parallel()
		_, _, s, ticks, queries := tickedStream(t, setupOpts{})
		before := queries.n.Load()
		for range 3 {
			keepAlive(t, ticks, s)
		}
		require.Equal(t, int64(3), queries.n.Load()-before, "one statement (the watch) per keep-alive")
	})

	t.Run("ReadsWhatNoNotificationAnnounced", func(t *testing.T) {
		t.Parallel()
		// No Listener: every transition is one whose notification is lost.
		b, job, s, ticks, queries := tickedStream(t, setupOpts{noListener: true})

		b.attempt(t, job.ID, jobs.Outcome{Status: jobs.StatusRetrying})
		before := queries.n.Load()
		keepAlive(t, ticks, s)
		require.Equal(t, []string{"running/2", "retrying/3"}, names([]sseFrame{s.nextEvent(t), s.nextEvent(t)}))
		require.Equal(t, int64(3), queries.n.Load()-before, "the watch, then the events and the job")

		b.attempt(t, job.ID, jobs.Outcome{Status: jobs.StatusSucceeded})
		tick(t, ticks)
		require.Equal(t, []string{"running/4", "succeeded/5"}, names(s.rest(t)))
	})
}
