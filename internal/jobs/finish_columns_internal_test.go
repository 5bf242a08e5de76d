package jobs

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/pgtest"
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

// TestFinish_WritesTheColumnsAsText pins what Finish writes, read back as Postgres's text of
// each column, in each of pgx's query modes that describe a statement (the batcher's pgx.Batch in
// each): an attempt's empty credential and class are empty text (not NULL: the columns refuse
// it), its start is the instant whatever its zone, a TTFB of 1 ns is 1e-06 ms (only none is
// NULL), an outcome without an answering credential leaves answered_by NULL, and an outcome
// without an attempt (its start the zero time) writes no attempt.
func TestFinish_WritesTheColumnsAsText(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.URL(t)
	for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeCacheStatement, pgx.QueryExecModeCacheDescribe,
		pgx.QueryExecModeDescribeExec} {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			cfg, err := pgxpool.ParseConfig(dbURL)
			require.NoError(t, err)
			cfg.ConnConfig.DefaultQueryExecMode = mode
			pool, err := pgxpool.NewWithConfig(ctx, cfg)
			require.NoError(t, err)
			defer pool.Close()
			s := NewStore(pool, nil)
			created, _, err := s.Create(ctx, CreateParams{Tenant: "default", Credential: "c",
				Request: json.RawMessage(`{"model":"m"}`), MaxAttempts: 3, Timeout: time.Hour})
			require.NoError(t, err)
			started := time.Date(2026, 12, 7, 10, 0, 0, 123000, time.FixedZone("+0530", 5*3600+1800))
			next := time.Now().Add(-time.Second)

			// Given an attempt with an empty credential and class, no TTFB, in a zone not UTC
			job, err := s.BeginAttempt(ctx, created.ID)
			require.NoError(t, err)
			first := &Attempt{Number: job.Attempts, StartedAt: started, Latency: 1500 * time.Microsecond,
				StatusCode: 503, LeaseToken: *job.LeaseToken}
			applied, err := s.Finish(ctx, job.ID, first, Outcome{Status: StatusRetrying, NextAttemptAt: &next})
			require.NoError(t, err)
			require.True(t, applied)
			// And one whose first byte came after 1 ns, succeeded without an answering credential
			job, err = s.BeginAttempt(ctx, created.ID)
			require.NoError(t, err)
			second := &Attempt{Number: job.Attempts, Credential: "d", StartedAt: started.Add(time.Minute),
				Latency: 300 * time.Millisecond, TTFB: time.Nanosecond, StatusCode: 200, Class: "ok",
				LeaseToken: *job.LeaseToken}
			applied, err = s.Finish(ctx, job.ID, second, Outcome{Status: StatusSucceeded, Result: json.RawMessage(`{}`)})
			require.NoError(t, err)
			require.True(t, applied)
			// And the same attempt's Finish run again (its commit's answer lost): found by its start
			applied, err = s.Finish(ctx, job.ID, second, Outcome{Status: StatusSucceeded, Result: json.RawMessage(`{}`)})
			require.NoError(t, err)
			require.True(t, applied)
			// And a job ended without an attempt
			other, _, err := s.Create(ctx, CreateParams{Tenant: "default", Credential: "c",
				Request: json.RawMessage(`{"model":"m"}`), MaxAttempts: 3, Timeout: time.Hour})
			require.NoError(t, err)
			applied, err = s.Finish(ctx, other.ID, nil, Outcome{Status: StatusDead, DeadReason: "r"})
			require.NoError(t, err)
			require.True(t, applied)

			// Then the columns hold, as text, what was given
			r, err := pool.Query(ctx, `SELECT concat_ws('|', job_id = $1, attempt, quote_nullable(credential),
				(started_at AT TIME ZONE 'UTC')::text, latency_ms::text, quote_nullable(ttfb_ms::text), quote_nullable(class))
				FROM job_attempts WHERE job_id IN ($1, $2) ORDER BY attempt`, job.ID, other.ID)
			require.NoError(t, err)
			rows, err := pgx.CollectRows(r, pgx.RowTo[string])
			require.NoError(t, err)
			require.Equal(t, []string{`t|1|''|2026-12-07 04:30:00.000123|1.5|NULL|''`,
				`t|2|'d'|2026-12-07 04:31:00.000123|300|'1e-06'|'ok'`}, rows)
			var answered, status, otherAnswered, otherStatus string
			require.NoError(t, pool.QueryRow(ctx, `SELECT quote_nullable(a.answered_by), a.status,
				quote_nullable(b.answered_by), b.status FROM jobs a, jobs b WHERE a.id = $1 AND b.id = $2`,
				job.ID, other.ID).Scan(&answered, &status, &otherAnswered, &otherStatus))
			require.Equal(t, []string{"NULL", "succeeded", "NULL", "dead"},
				[]string{answered, status, otherAnswered, otherStatus})
		})
	}
}
