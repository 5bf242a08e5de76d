package api

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/jobs"
)

// heldWrites holds each stream's write of a job's result (the bytes of marker) until release:
// the stream stays open, following its job, as one whose client does not read. Each write held
// first flushes what the stream wrote before it (its headers) and is told on held.
type heldWrites struct {
	marker []byte
	held   chan struct{}
	gate   chan struct{}
	once   sync.Once
}

func (h *heldWrites) wrap(next *Server) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		next.ServeHTTP(&heldWriter{ResponseWriter: w, h: h}, r)
	})
}

// release lets every write held go on, and any later one.
func (h *heldWrites) release() { h.once.Do(func() { close(h.gate) }) }

type heldWriter struct {
	http.ResponseWriter
	h    *heldWrites
	done bool
}

func (w *heldWriter) Write(p []byte) (int, error) {
	if !w.done && bytes.Contains(p, w.h.marker) {
		w.done = true
		_ = http.NewResponseController(w.ResponseWriter).Flush()
		w.h.held <- struct{}{}
		<-w.h.gate
	}
	return w.ResponseWriter.Write(p)
}

// Unwrap lets the stream's ResponseController reach the connection.
func (w *heldWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// TestEvents_StreamsOfAnEndedJobShareItsRead: streams opened on a job that has ended, while
// others of it are still sending its terminal event, take the read of the job those made: each
// reads only the job's head (streamJob). Each read the job's events and the job, its result
// with it, and encoded the terminal event for itself before: 100 streams never read of a job
// with a 12 MB result held 1.7 GB.
func TestEvents_StreamsOfAnEndedJobShareItsRead(t *testing.T) {
	t.Parallel()
	const streams = 8
	h := &heldWrites{marker: bytes.Repeat([]byte("x"), 64), held: make(chan struct{}, streams), gate: make(chan struct{})}
	queries := &queryCounter{}
	b := setup(t, setupOpts{queries: queries, wrap: h.wrap})
	t.Cleanup(h.release) // before the server's shutdown: no stream is left held
	job := b.create(t, "")
	text := strings.Repeat("x", 256<<10)
	result, err := json.Marshal(map[string]string{"text": text})
	require.NoError(t, err)
	b.attempt(t, job.ID, jobs.Outcome{Status: jobs.StatusSucceeded, Result: result})

	before := queries.n.Load()
	var opened []*stream
	for range streams {
		s := openStream(t, b.url, job.ID, "")
		s.lines.Buffer(nil, 1<<20) // the result's line
		opened = append(opened, s)
		select {
		case <-h.held:
		case <-time.After(30 * time.Second):
			t.Fatal("the stream did not write the job's result within 30s")
		}
	}
	require.Equal(t, int64(streams+2), queries.n.Load()-before,
		"each stream's read of the job's head, and one read of its events and of the job for all")

	h.release()
	for _, s := range opened {
		frames := s.rest(t)
		require.Equal(t, []string{"succeeded/3"}, names(frames))
		require.Equal(t, text, jobData(t, frames[0])["result"].(map[string]any)["text"])
	}
}

// TestFollower_WriteSendsALargeEventsDataAsItIs: a large event's data (a result) is written as
// it is, the encoding the job's streams share, not copied into the stream's frame, which a
// client that does not read held until the write timeout, a copy each.
func TestFollower_WriteSendsALargeEventsDataAsItIs(t *testing.T) {
	t.Parallel()
	data := bytes.Repeat([]byte("y"), 2*maxKeptFrame)
	var w writesRecorder
	f := &follower{}
	require.NoError(t, f.write(&w, streamItem{pos: eventPos{seq: 3}, name: "succeeded", data: data}))
	require.Equal(t, "event: succeeded\nid: 3\ndata: "+string(data)+"\n\n", w.buf.String())
	require.True(t, w.wrote(data), "the data is written from its own bytes")
	require.LessOrEqual(t, cap(f.frame), maxKeptFrame)

	// A small event is one write, of the frame.
	w = writesRecorder{}
	require.NoError(t, f.write(&w, streamItem{pos: eventPos{seq: 4, n: 2}, name: "delta", data: []byte(`{"d":1}`)}))
	require.Equal(t, "event: delta\nid: 4.2\ndata: {\"d\":1}\n\n", w.buf.String())
	require.Len(t, w.writes, 1)
}

// writesRecorder keeps what is written to it, and each slice it was given.
type writesRecorder struct {
	buf    bytes.Buffer
	writes [][]byte
}

func (w *writesRecorder) Write(p []byte) (int, error) {
	w.writes = append(w.writes, p)
	return w.buf.Write(p)
}

// wrote reports whether data itself (its bytes, not a copy) was one of the writes.
func (w *writesRecorder) wrote(data []byte) bool {
	for _, p := range w.writes {
		if len(p) == len(data) && unsafe.SliceData(p) == unsafe.SliceData(data) {
			return true
		}
	}
	return false
}
