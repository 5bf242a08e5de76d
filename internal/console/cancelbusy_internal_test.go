package console

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/jobs"
)

// TestJobCancel_BusyJobIs503WithRetryAfter: a cancel whose job changed status under each of its
// runs (jobs.ErrBusy: a dead job retried and ending again meanwhile,
// TestStore_CancelOfAJobEndingUnderEachRunIsBusy) did nothing, and the next click likely takes:
// the console answers it as the API's DELETE does, 503 job_busy with Retry-After, not logged as
// its failure. It was 500 internal, logged as an error.
func TestJobCancel_BusyJobIs503WithRetryAfter(t *testing.T) {
	t.Parallel()
	r := httptest.NewRequest(http.MethodPost, "/console/api/jobs/0190a5b2-7c1e-7d3f-9a8b-123456789abc/cancel", nil)
	logged := &countingHandler{}
	rec := httptest.NewRecorder()
	writeError(rec, r, slog.New(logged), fmt.Errorf("cancel job: %w (3 tries)", jobs.ErrBusy))
	require.Equal(t, http.StatusServiceUnavailable, rec.Code)
	require.Equal(t, "1", rec.Header().Get("Retry-After"))
	require.Contains(t, rec.Body.String(), `"type":"job_busy"`)
	require.Zero(t, logged.n, "not logged as the console's failure")
}

// countingHandler is a slog.Handler counting the records at Warn and above.
type countingHandler struct{ n int }

func (h *countingHandler) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelWarn }
func (h *countingHandler) Handle(context.Context, slog.Record) error    { h.n++; return nil }
func (h *countingHandler) WithAttrs([]slog.Attr) slog.Handler           { return h }
func (h *countingHandler) WithGroup(string) slog.Handler                { return h }
