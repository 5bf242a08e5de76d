package eventsource_test

import (
	"math"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/eventsource"
)

// TestAccepts: an Accept header that names text/event-stream, in any case, alone or in a list,
// with any q but 0, is an EventSource's; a wildcard (curl's */*) or none is not.
func TestAccepts(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		accept []string
		want   bool
	}{
		{[]string{"text/event-stream"}, true},
		{[]string{"Text/Event-Stream"}, true},
		{[]string{" text/event-stream "}, true},
		{[]string{"text/html, text/event-stream;q=0.5"}, true},
		{[]string{"application/json", "text/event-stream"}, true},
		{[]string{"text/event-stream; charset=utf-8; Q=1"}, true},
		{[]string{"text/event-stream;q=bogus"}, true},
		{[]string{"text/event-stream;q=0, text/event-stream"}, true},
		{[]string{"text/event-stream;q=0"}, false},
		{[]string{"text/event-stream; q=0.000"}, false},
		{[]string{"*/*"}, false},
		{[]string{"text/*"}, false},
		{[]string{"application/json, */*;q=0.8"}, false},
		{[]string{"text/event-streams"}, false},
		{[]string{""}, false},
		{nil, false},
	} {
		r := httptest.NewRequest(http.MethodGet, "/", nil)
		for _, v := range c.accept {
			r.Header.Add("Accept", v)
		}
		require.Equal(t, c.want, eventsource.Accepts(r), "Accept: %q", c.accept)
	}
}

// TestRefuse: a 200 event stream with Retry-After, the refusal as one comment line, and a retry
// field of the draw times Retry-After in milliseconds: below it for any draw in [0, 1). The
// caller's headers stay.
func TestRefuse(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		draw  float64
		retry string
	}{
		{0, "0"},
		{0.5, "2500"},
		{math.Nextafter(1, 0), "4999"},
	} {
		w := httptest.NewRecorder()
		w.Header().Set("Cache-Control", "no-store")
		eventsource.Refuse(w, "unavailable", "the store\nis down", 5, c.draw)
		res := w.Result()
		require.Equal(t, http.StatusOK, res.StatusCode)
		require.Equal(t, "text/event-stream", res.Header.Get("Content-Type"))
		require.Equal(t, "5", res.Header.Get("Retry-After"))
		require.Equal(t, "no-store", res.Header.Get("Cache-Control"))
		require.Equal(t, ": unavailable: the store is down\nretry: "+c.retry+"\n\n", w.Body.String(), "draw %v", c.draw)
	}
}
