package api

import (
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/jobs"
)

// TestCancel_BusyJobIs503WithRetryAfter: a cancel whose job changed status under each of its
// runs (jobs.ErrBusy: a dead job retried and ending again meanwhile,
// TestStore_CancelOfAJobEndingUnderEachRunIsBusy) did nothing, and its next try likely takes: it
// is answered 503 job_busy with Retry-After, a passing refusal a client retries, not logged as
// the server's failure. It was 500 internal, logged as an error.
func TestCancel_BusyJobIs503WithRetryAfter(t *testing.T) {
	t.Parallel()
	r := httptest.NewRequest(http.MethodDelete, "/v1/jobs/0190a5b2-7c1e-7d3f-9a8b-123456789abc", nil)
	he, failure := classifyError(r, fmt.Errorf("cancel job: %w (3 tries)", jobs.ErrBusy))
	require.NotNil(t, he)
	require.Nil(t, failure, "not the server's failure")
	require.Equal(t, http.StatusServiceUnavailable, he.status)
	require.Equal(t, "job_busy", he.typ)
	require.Equal(t, "1", he.header.Get("Retry-After"))
	require.Contains(t, he.message, "retry")
	rec := httptest.NewRecorder()
	writeError(rec, r, slog.New(slog.NewTextHandler(io.Discard, nil)), fmt.Errorf("cancel job: %w", jobs.ErrBusy))
	require.Equal(t, http.StatusServiceUnavailable, rec.Code)
	require.Equal(t, "1", rec.Header().Get("Retry-After"))
}
