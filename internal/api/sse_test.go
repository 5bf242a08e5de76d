package api

import (
	"context"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/jobs"
)

var failTwiceThenSucceed = []string{
	"queued/1", "running/2", "retrying/3", "running/4", "retrying/5", "running/6", "succeeded/7",
}

func TestEvents_EveryTransitionInOrder(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	job := b.create(t, "")

	s := openStream(t, b.url, job.ID, "")
	first := s.nextEvent(t)
	require.Equal(t, "queued/1", names([]sseFrame{first})[0], "the stream starts at the current state")
	require.Equal(t, job.ID, jobData(t, first)["id"])

	// Each transition is made only once the previous event arrived, so each one reaches the
	// stream through a notification (the keep-alive re-read is 15s away).
	got := []sseFrame{first}
	b.attempt(t, job.ID, jobs.Outcome{Status: jobs.StatusRetrying})
	got = append(got, s.nextEvent(t), s.nextEvent(t))
	b.attempt(t, job.ID, jobs.Outcome{Status: jobs.StatusRetrying})
	got = append(got, s.nextEvent(t), s.nextEvent(t))
	b.attempt(t, job.ID, jobs.Outcome{Status: jobs.StatusSucceeded, Result: []byte(`{"answer":42}`)})
	got = append(got, s.rest(t)...) // the stream closes after the terminal event

	require.Equal(t, failTwiceThenSucceed, names(got))
	for _, f := range got {
		require.Equal(t, f.event, jobData(t, f)["status"], "data.status is the event's status")
	}
	last := jobData(t, got[len(got)-1])
	require.Equal(t, map[string]any{"answer": float64(42)}, last["result"])
	require.EqualValues(t, 3, last["attempts"])
	retrying := jobData(t, got[2])
	require.Equal(t, "retryable", retrying["last_error"].(map[string]any)["class"])
}

func TestEvents_LastEventIDResumes(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})

	t.Run("MidStream", func(t *testing.T) {
		t.Parallel()
		job := b.create(t, "")
		b.attempt(t, job.ID, jobs.Outcome{Status: jobs.StatusRetrying})

		s := openStream(t, b.url, job.ID, "0")
		got := []sseFrame{s.nextEvent(t), s.nextEvent(t)}
		require.Equal(t, []string{"queued/1", "running/2"}, names(got))
		s.close() // event 3 is committed but not read: the client is gone

		b.attempt(t, job.ID, jobs.Outcome{Status: jobs.StatusRetrying})
		s2 := openStream(t, b.url, job.ID, got[1].id)
		require.Equal(t, []string{"retrying/3", "running/4", "retrying/5"},
			names([]sseFrame{s2.nextEvent(t), s2.nextEvent(t), s2.nextEvent(t)}))
		b.attempt(t, job.ID, jobs.Outcome{Status: jobs.StatusSucceeded, Result: []byte(`{}`)})
		require.Equal(t, []string{"running/6", "succeeded/7"}, names(s2.rest(t)))
	})

	t.Run("ZeroReplaysHistory", func(t *testing.T) {
		t.Parallel()
		job := b.create(t, "")
		b.failTwiceThenSucceed(t, job.ID)
		require.Equal(t, failTwiceThenSucceed, names(openStream(t, b.url, job.ID, "0").rest(t)))
	})

	t.Run("EachResumePoint", func(t *testing.T) {
		t.Parallel()
		job := b.create(t, "")
		b.failTwiceThenSucceed(t, job.ID)
		for n := range 7 {
			got := names(openStream(t, b.url, job.ID, strconv.Itoa(n)).rest(t))
			require.Equal(t, failTwiceThenSucceed[n:], got, "Last-Event-ID %d", n)
		}
	})

	t.Run("AfterTerminalIsNoContent", func(t *testing.T) {
		t.Parallel()
		job := b.create(t, "")
		b.failTwiceThenSucceed(t, job.ID)
		for _, id := range []string{"7", "8", "100"} {
			r := b.do(t, http.MethodGet, "/v1/jobs/"+job.ID+"/events", "", map[string]string{"Last-Event-ID": id})
			require.Equal(t, http.StatusNoContent, r.status, "Last-Event-ID %s", id)
		}
		// Before the terminal event, a reconnect still gets the rest.
		require.Equal(t, []string{"succeeded/7"}, names(openStream(t, b.url, job.ID, "6").rest(t)))
	})

	t.Run("Invalid", func(t *testing.T) {
		t.Parallel()
		job := b.create(t, "")
		// Beside the malformed: a sign, numbers past job_events.seq's integer (a 500 before), and
		// an event the job has not reached (waiting for it skipped the terminal event).
		for _, v := range []string{"x", "-1", "1.", ".5", "1.x", "1.-2", "1.2.3", "+1", "1.+2",
			"2147483648", "9223372036854775807", "1.2147483648", "2"} {
			r := b.do(t, http.MethodGet, "/v1/jobs/"+job.ID+"/events", "", map[string]string{"Last-Event-ID": v})
			require.Equal(t, http.StatusBadRequest, r.status, "Last-Event-ID %s", v)
			require.Equal(t, "invalid_last_event_id", r.body["error"].(map[string]any)["type"])
		}
	})
}

func TestEvents_TerminalJobSendsTerminalEventAtOnce(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})

	t.Run("Succeeded", func(t *testing.T) {
		t.Parallel()
		job := b.create(t, "")
		b.failTwiceThenSucceed(t, job.ID)
		got := openStream(t, b.url, job.ID, "").rest(t)
		require.Equal(t, []string{"succeeded/7"}, names(got))
		require.Equal(t, map[string]any{"answer": float64(42)}, jobData(t, got[0])["result"])
	})
	t.Run("Failed", func(t *testing.T) {
		t.Parallel()
		job := b.create(t, "")
		b.attempt(t, job.ID, jobs.Outcome{Status: jobs.StatusFailed, LastError: &jobs.LastError{Class: "permanent", Status: 400, Message: "bad"}})
		got := openStream(t, b.url, job.ID, "").rest(t)
		require.Equal(t, []string{"failed/3"}, names(got))
		require.Equal(t, "bad", jobData(t, got[0])["last_error"].(map[string]any)["message"])
	})
	t.Run("Canceled", func(t *testing.T) {
		t.Parallel()
		job := b.create(t, "")
		_, err := b.store.Cancel(context.Background(), job.ID)
		require.NoError(t, err)
		require.Equal(t, []string{"canceled/2"}, names(openStream(t, b.url, job.ID, "").rest(t)))
	})
}

func TestEvents_TwoReplicasStreamTheSameJob(t *testing.T) {
	t.Parallel()
	a := setup(t, setupOpts{})
	b := setup(t, setupOpts{dbURL: a.dbURL}) // another API process on the same database
	job := a.create(t, "")

	sa := openStream(t, a.url, job.ID, "")
	sb := openStream(t, b.url, job.ID, "")
	require.Equal(t, "queued", sa.nextEvent(t).event)
	require.Equal(t, "queued", sb.nextEvent(t).event)
	// Transitions are written through a third connection (a worker's, say): each replica hears
	// of them from Postgres.
	a.failTwiceThenSucceed(t, job.ID)
	want := failTwiceThenSucceed[1:]
	require.Equal(t, want, names(sa.rest(t)))
	require.Equal(t, want, names(sb.rest(t)))
}

func TestEvents_KeepAlive(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{keepAlive: 20 * time.Millisecond})
	job := b.create(t, "")

	s := openStream(t, b.url, job.ID, "")
	require.Equal(t, "queued", s.nextEvent(t).event)
	for range 3 {
		f, ok := s.next(t)
		require.True(t, ok)
		require.Equal(t, sseFrame{comment: "keep-alive"}, f)
	}
}

func TestEvents_WithoutListenerFallsBackToKeepAliveReads(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{keepAlive: 20 * time.Millisecond, noListener: true})
	job := b.create(t, "")

	s := openStream(t, b.url, job.ID, "")
	require.Equal(t, "queued", s.nextEvent(t).event)
	b.failTwiceThenSucceed(t, job.ID)
	require.Equal(t, failTwiceThenSucceed[1:], names(s.rest(t)))
}

func TestEvents_DisconnectLeavesNothing(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	job := b.create(t, "")

	streams := make([]*stream, 5)
	for i := range streams {
		streams[i] = openStream(t, b.url, job.ID, "")
		streams[i].nextEvent(t)
	}
	require.Equal(t, 5, b.listener.Subscribers())
	for _, s := range streams {
		s.close()
	}
	// The handlers notice the closed connections and unsubscribe; goleak checks the rest at exit.
	require.Eventually(t, func() bool { return b.listener.Subscribers() == 0 }, 30*time.Second, 5*time.Millisecond)
}

func TestEvents_ShutdownEndsStreams(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	job := b.create(t, "")
	s := openStream(t, b.url, job.ID, "")
	s.nextEvent(t)

	b.srv.Shutdown()
	require.Empty(t, s.rest(t))
	require.Eventually(t, func() bool { return b.listener.Subscribers() == 0 }, 30*time.Second, 5*time.Millisecond)
}

func TestEvents_NotFound(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	other := b.create(t, "someone-else")

	for name, id := range map[string]string{
		"Unknown":      "0190a5b2-7c1e-7d3f-9a8b-123456789abc",
		"Malformed":    "nope",
		"OtherTenants": other.ID,
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			r := b.do(t, http.MethodGet, "/v1/jobs/"+id+"/events", "", nil)
			require.Equal(t, http.StatusNotFound, r.status)
			require.Equal(t, "not_found", r.body["error"].(map[string]any)["type"])
		})
	}
}
