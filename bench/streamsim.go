package main

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"regexp"
	"sync"
	"time"
)

// simRecorder wraps the simulator and records, for each streamed call, when it arrived and
// the text of each content token with the moment it was flushed to the connection: the
// provider's side of every lag, on the bench's own clock. Calls are told apart by the marker
// in their prompt (streamRequest).
type simRecorder struct {
	h     http.Handler
	mu    sync.Mutex
	calls map[string]*simCall // by marker; a retry of the same job replaces its call
	tries map[string]int      // calls per marker
}

func newSimRecorder(h http.Handler) *simRecorder {
	return &simRecorder{h: h, calls: map[string]*simCall{}, tries: map[string]int{}}
}

// simCall is one streamed call as the simulator sent it.
type simCall struct {
	mu      sync.Mutex
	arrived time.Time
	text    []byte
	ends    []int       // len(text) after each token
	at      []time.Time // when each token was flushed
}

// snapshot returns the call's text and tokens so far.
func (c *simCall) snapshot() (text []byte, ends []int, at []time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.text, c.ends, c.at
}

// firstToken is the time from the call's arrival to its first token's flush; false before one.
func (c *simCall) firstToken() (time.Duration, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.at) == 0 {
		return 0, false
	}
	return c.at[0].Sub(c.arrived), true
}

var markerRE = regexp.MustCompile(`"content":"stream ([^"]+)"`)

func (s *simRecorder) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	arrived := time.Now()
	body, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	m := markerRE.FindSubmatch(body)
	if m == nil {
		s.h.ServeHTTP(w, r)
		return
	}
	call := &simCall{arrived: arrived}
	s.mu.Lock()
	s.calls[string(m[1])] = call
	s.tries[string(m[1])]++
	s.mu.Unlock()
	s.h.ServeHTTP(&recordingWriter{ResponseWriter: w, call: call}, r)
}

// call returns the latest call with marker, and how many calls had it.
func (s *simRecorder) call(marker string) (*simCall, int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.calls[marker], s.tries[marker]
}

// recordingWriter passes a streamed answer through and stamps each content_block_delta's text
// when the simulator flushes it (the simulator flushes after every event).
type recordingWriter struct {
	http.ResponseWriter
	call *simCall
	buf  []byte
}

func (w *recordingWriter) Write(p []byte) (int, error) {
	w.buf = append(w.buf, p...)
	return w.ResponseWriter.Write(p)
}

// FlushError is what http.ResponseController.Flush calls.
func (w *recordingWriter) FlushError() error {
	err := http.NewResponseController(w.ResponseWriter).Flush()
	w.parse(time.Now())
	return err
}

func (w *recordingWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// parse records the complete events written so far, stamped at.
func (w *recordingWriter) parse(at time.Time) {
	for {
		i := bytes.Index(w.buf, []byte("\n\n"))
		if i < 0 {
			return
		}
		ev := w.buf[:i]
		w.buf = w.buf[i+2:]
		if !bytes.HasPrefix(ev, []byte("event: content_block_delta\n")) {
			continue
		}
		_, data, _ := bytes.Cut(ev, []byte("data: "))
		var d struct {
			Delta struct {
				Text string `json:"text"`
			} `json:"delta"`
		}
		if json.Unmarshal(data, &d) != nil {
			continue
		}
		w.call.mu.Lock()
		w.call.text = append(w.call.text, d.Delta.Text...)
		w.call.ends = append(w.call.ends, len(w.call.text))
		w.call.at = append(w.call.at, at)
		w.call.mu.Unlock()
	}
}
