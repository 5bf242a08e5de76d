package api

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/clocktest"
	"github.com/llmq/llmq/internal/logtest"
)

// TestEvents_RefusedStreamsLogThrottled: every stream refused before its headers for a failure
// of the store (unreachable, or past its bound) wrote a line of its own: the pages an outage
// refuses come back every few seconds each (their retry), thousands of lines a second. They are
// logged as the streams' other failures are (streamLog): one line per message and interval,
// counting those held back, and a line of their own for the last held back once the interval
// has passed. The answers are unchanged.
func TestEvents_RefusedStreamsLogThrottled(t *testing.T) {
	t.Parallel()
	b, logs, clock, timers := setupStreamLog(t)
	timedOut, cancel := context.WithCancelCause(context.Background())
	cancel(errStoreTimeout)
	unreachable := &pgconn.PgError{Code: "57P01", Message: "terminating connection due to administrator command"}
	refuse := func(ctx context.Context, accept string, err error) *httptest.ResponseRecorder {
		r := httptest.NewRequestWithContext(ctx, http.MethodGet, "/v1/jobs/x/events", nil)
		if accept != "" {
			r.Header.Set("Accept", accept)
		}
		w := httptest.NewRecorder()
		b.srv.refuseStream(w, r, err)
		return w
	}
	for range 3 {
		w := refuse(context.Background(), "text/event-stream", unreachable)
		require.Equal(t, http.StatusOK, w.Code)
		require.Contains(t, w.Body.String(), "\nretry: 2500\n\n")
		w = refuse(context.Background(), "", unreachable)
		require.Equal(t, http.StatusServiceUnavailable, w.Code)
		w = refuse(timedOut, "text/event-stream", context.Canceled)
		require.Equal(t, http.StatusOK, w.Code)
	}
	require.Equal(t, 1, logs.Count(`"msg":"store unavailable"`), logs.String())
	require.Equal(t, 1, logs.Count(`"msg":"store timed out"`), logs.String())

	clock.Advance(streamLogInterval)
	timers.fire(t)
	// The report is the last held back's line (its request and error), counting them all.
	require.Equal(t, 1, logs.Count(`"msg":"store unavailable","method":"GET","path":"/v1/jobs/x/events",`+
		`"error":": terminating connection due to administrator command (SQLSTATE 57P01)","suppressed":5`), logs.String())
	require.Equal(t, 1, logs.Count(`"msg":"store timed out","method":"GET","path":"/v1/jobs/x/events","error":"context canceled","suppressed":2`), logs.String())
}

// TestStreamsSuppressed_ReportsAtTheHighestLevelHeldBack: the report of the stream lines the
// throttle held back was always a warning, the internal errors of refused streams (each an
// error, as its first line is) too: an alert on errors missed all but the first of a burst. It
// is at the highest level among those held back now.
func TestStreamsSuppressed_ReportsAtTheHighestLevelHeldBack(t *testing.T) {
	t.Parallel()
	b, logs, clock, timers := setupStreamLog(t)
	for range 3 {
		r := httptest.NewRequestWithContext(context.Background(), http.MethodGet, "/v1/jobs/x/events", nil)
		w := httptest.NewRecorder()
		b.srv.refuseStream(w, r, errors.New("boom"))
		require.Equal(t, http.StatusInternalServerError, w.Code)
	}
	require.Equal(t, 1, logs.Count(`"level":"ERROR","msg":"internal error"`), logs.String())
	clock.Advance(streamLogInterval)
	timers.fire(t)
	require.Equal(t, 1, logs.Count(`"level":"ERROR","msg":"internal error","method":"GET","path":"/v1/jobs/x/events","error":"boom","suppressed":2`),
		"the report of two internal errors is an error: %s", logs.String())

	// A warning's report stays a warning.
	b.srv.streamWarn(context.Background(), "renew event watch", "job-1", errors.New("connection refused"))
	b.srv.streamWarn(context.Background(), "renew event watch", "job-2", errors.New("connection refused"))
	clock.Advance(streamLogInterval)
	timers.fire(t)
	require.Equal(t, 1, logs.Count(`"level":"WARN","msg":"renew event watch","job_id":"job-2","error":"connection refused","suppressed":1`), logs.String())
}

// setupStreamLog is a server without a Listener whose stream log (streamLog) writes JSON lines to
// logs, on clock's time, with report timers that fire when told.
func setupStreamLog(t *testing.T) (b *testBundle, logs *logtest.Buffer, clock *clocktest.Clock, timers *manualTimers) {
	t.Helper()
	logs, timers = &logtest.Buffer{}, &manualTimers{}
	clock = clocktest.New(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	b = setup(t, setupOpts{noListener: true, now: clock.Now, retryRand: func() float64 { return 0.5 },
		logger: slog.New(slog.NewJSONHandler(logs, nil))})
	b.srv.streamLog.SetAfterFunc(timers.afterFunc)
	return b, logs, clock, timers
}
