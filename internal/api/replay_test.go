package api

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/jobs"
)

// TestEvents_ReplayWritesEachEventAsEncoded: a replay of a job's history (Last-Event-ID: 0) writes
// each event once it is encoded, not after encoding them all: each event carries the job (its
// result too), so a job of many events held them all in memory before the client had a byte,
// once per client replaying it.
func TestEvents_ReplayWritesEachEventAsEncoded(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{noListener: true})
	job := b.create(t, "")
	b.attempt(t, job.ID, jobs.Outcome{Status: jobs.StatusRetrying})
	b.attempt(t, job.ID, jobs.Outcome{Status: jobs.StatusRetrying})
	b.attempt(t, job.ID, jobs.Outcome{Status: jobs.StatusSucceeded,
		Result: json.RawMessage(`{"answer":"` + strings.Repeat("x", 64<<10) + `"}`)})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	evs, err := b.store.Events(ctx, job.ID, 0)
	require.NoError(t, err)
	require.Len(t, evs, 7)
	fresh, err := b.store.Get(ctx, job.ID)
	require.NoError(t, err)

	rd := &sharedRead{evs: evs, job: fresh, data: make([]eventEncoding, len(evs)), done: make(chan struct{})}
	close(rd.done)
	f := &follower{read: rd.result(0)}
	encoded := func() int {
		n := 0
		for i := range rd.data {
			if rd.data[i].b != nil {
				n++
			}
		}
		return n
	}
	w := &encodedAtWrite{encoded: encoded}
	done, err := b.srv.sendEvents(w, (&http.Request{}).WithContext(ctx), job.ID, f, readStatus, 0)
	require.NoError(t, err)
	require.True(t, done, "the terminal event sent")
	require.Equal(t, []int{1, 2, 3, 4, 5, 6, 7}, w.at, "events encoded when each of the 7 frames was written")
}

// encodedAtWrite records, at each frame's first write, how many events encoded() says are (a
// large event's data is a write of its own: follower.write).
type encodedAtWrite struct {
	encoded func() int
	at      []int
}

func (w *encodedAtWrite) Write(p []byte) (int, error) {
	if bytes.HasPrefix(p, []byte("event: ")) {
		w.at = append(w.at, w.encoded())
	}
	return len(p), nil
}
