package jobs

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestFinish_StoresTheAttemptsColumns: Finish stores an attempt's credential, class, start,
// latency and TTFB as given (no TTFB: NULL), moves the job to the outcome's status, and keeps
// the job's answering credential when the outcome names none (NULL, as coalesce reads it),
// setting it when it names one.
func TestFinish_StoresTheAttemptsColumns(t *testing.T) {
	t.Parallel()
	ctx, _, s, created := scanSetup(t)
	job, err := s.BeginAttempt(ctx, created.ID)
	require.NoError(t, err)
	started := time.Date(2026, 12, 7, 10, 0, 0, 123000, time.UTC)
	next := time.Now().Add(-time.Second)

	// Given a first attempt that failed without an answer (no TTFB, no answering credential)
	first := &Attempt{Number: job.Attempts, Credential: "c", StartedAt: started, Latency: 1500 * time.Microsecond,
		StatusCode: 503, Class: "server", LeaseToken: *job.LeaseToken}
	applied, err := s.Finish(ctx, job.ID, first, Outcome{Status: StatusRetrying, NextAttemptAt: &next})
	require.NoError(t, err)
	require.True(t, applied)
	got, err := s.Get(ctx, job.ID)
	require.NoError(t, err)
	require.Equal(t, StatusRetrying, got.Status)
	require.Nil(t, got.AnsweredBy)

	// And a second that answered
	job, err = s.BeginAttempt(ctx, created.ID)
	require.NoError(t, err)
	second := &Attempt{Number: job.Attempts, Credential: "d", StartedAt: started.Add(time.Minute),
		Latency: 300 * time.Millisecond, TTFB: 250 * time.Microsecond, StatusCode: 200, Class: "ok",
		LeaseToken: *job.LeaseToken}
	applied, err = s.Finish(ctx, job.ID, second, Outcome{Status: StatusSucceeded, Result: json.RawMessage(`{}`),
		AnsweredBy: "d"})
	require.NoError(t, err)
	require.True(t, applied)

	// Then the rows hold what was given
	got, err = s.Get(ctx, job.ID)
	require.NoError(t, err)
	require.Equal(t, StatusSucceeded, got.Status)
	require.NotNil(t, got.AnsweredBy)
	require.Equal(t, "d", *got.AnsweredBy)
	rows, err := s.Attempts(ctx, job.ID)
	require.NoError(t, err)
	require.Len(t, rows, 2)
	require.Equal(t, "c", rows[0].Credential)
	require.Equal(t, "server", rows[0].Class)
	require.True(t, started.Equal(rows[0].StartedAt), rows[0].StartedAt)
	require.InDelta(t, 1.5, rows[0].LatencyMS, 1e-9)
	require.Nil(t, rows[0].TTFBMS)
	require.Equal(t, "d", rows[1].Credential)
	require.Equal(t, "ok", rows[1].Class)
	require.True(t, started.Add(time.Minute).Equal(rows[1].StartedAt), rows[1].StartedAt)
	require.InDelta(t, 300.0, rows[1].LatencyMS, 1e-9)
	require.NotNil(t, rows[1].TTFBMS)
	require.InDelta(t, 0.25, *rows[1].TTFBMS, 1e-9)
}
