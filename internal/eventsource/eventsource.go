// Package eventsource tells a browser's EventSource to come back. An EventSource ends for good
// on any answer but a 200 event stream (the SSE spec's "fail the connection"), and reconnects by
// itself after a stream that ends, after its reconnection time: a stream refused for a reason
// that passes (a slow or unreachable database) is so answered a 200 event stream that holds only
// a comment and a retry field, not the 503 that would end it. The API's event streams and the console's live
// pages answer alike.
package eventsource

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"
)

// Accepts reports whether r's Accept header names text/event-stream (not refused with q=0), as
// every EventSource's does. A wildcard (*/*, text/*) does not count: curl sends */*, and wants
// the error status.
func Accepts(r *http.Request) bool {
	for _, v := range r.Header.Values("Accept") {
		for part := range strings.SplitSeq(v, ",") {
			media, params, _ := strings.Cut(part, ";")
			if !strings.EqualFold(strings.TrimSpace(media), "text/event-stream") {
				continue
			}
			refused := false
			for param := range strings.SplitSeq(params, ";") {
				k, v, _ := strings.Cut(param, "=")
				if strings.EqualFold(strings.TrimSpace(k), "q") {
					q, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
					refused = err == nil && q <= 0
				}
			}
			if !refused {
				return true
			}
		}
	}
	return false
}

// Refuse answers w a 200 event stream that holds only a comment naming the refusal (typ and
// message, line breaks made spaces) and a retry field of draw × retryAfterSeconds (in
// milliseconds; draw in [0, 1): a full-jitter draw, so that the clients one slowdown refused do
// not all come back in the same millisecond), with the header Retry-After: retryAfterSeconds,
// and ends. It carries no id (the client keeps its Last-Event-ID). The caller sets any other
// header (Cache-Control) first.
func Refuse(w http.ResponseWriter, typ, message string, retryAfterSeconds int, draw float64) {
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Retry-After", strconv.Itoa(retryAfterSeconds))
	w.WriteHeader(http.StatusOK)
	retry := int64(draw * float64(retryAfterSeconds*1000))
	_, _ = fmt.Fprintf(w, ": %s: %s\nretry: %d\n\n", typ, strings.ReplaceAll(message, "\n", " "), retry)
}
