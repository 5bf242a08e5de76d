package jobs_test

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/deltastream"
	"github.com/llmq/llmq/internal/jobs"
	"github.com/llmq/llmq/internal/jobstest"
)

// TestStore_GetForStream: whether a job streams is answered by Postgres as deltastream.Requested
// answers of its request, and neither the request nor the result is read.
func TestStore_GetForStream(t *testing.T) {
	t.Parallel()
	b := jobstest.New(t)
	ctx := context.Background()
	never := func([]byte) bool { panic("the request was read") }

	bodies := []string{
		`{"model":"m"}`, `{"model":"m","stream":true}`, `{"stream": true }`, `{"stream":false}`,
		`{"stream":"true"}`, `{"stream":1}`, `{"stream":null}`, `{"\u0073tream":true}`,
		`{"Stream":true}`, `{"stream":true,"stream":false}`, `{"stream":false,"stream":true}`,
		`{"a":{"stream":true}}`, `{"streams":true}`, `["stream",true]`, `"stream"`, `true`,
		`{"model":"caf\u00e9","stream":true,"n":[1,{"stream":false}]}`,
	}
	for _, body := range bodies {
		job := b.Create(t, jobstest.Opts{Request: json.RawMessage(body)})
		got, streams, err := b.Store.GetForStream(ctx, job.ID, never)
		require.NoError(t, err, body)
		require.Equal(t, deltastream.Requested([]byte(body)), streams, body)
		require.Nil(t, got.Request, body)
		require.Equal(t, job.ID, got.ID)
		require.Equal(t, job.EventSeq, got.EventSeq)
	}

	t.Run("NoResult", func(t *testing.T) {
		t.Parallel()
		job := b.Create(t, jobstest.Opts{Request: json.RawMessage(`{"stream":true}`)})
		b.Attempt(t, job.ID, jobs.Outcome{Status: jobs.StatusSucceeded, Result: json.RawMessage(`{"answer":42}`)})
		got, streams, err := b.Store.GetForStream(ctx, job.ID, never)
		require.NoError(t, err)
		require.True(t, streams)
		require.Equal(t, jobs.StatusSucceeded, got.Status)
		require.Nil(t, got.Result)
	})
	t.Run("RequestPostgresCannotReadAsText", func(t *testing.T) {
		t.Parallel()
		// Stored by an earlier release (submits refuse it now): Postgres fails on it, the job is
		// read whole and the request asked.
		for body, want := range map[string]bool{`{"stream":true,"x":"\u0000"}`: true, `{"x":"\ud800"}`: false} {
			job := b.Create(t, jobstest.Opts{})
			_, err := b.Pool.Exec(ctx, `UPDATE jobs SET request = $2::json WHERE id = $1`, job.ID, body)
			require.NoError(t, err)
			got, streams, err := b.Store.GetForStream(ctx, job.ID, deltastream.Requested)
			require.NoError(t, err, body)
			require.Equal(t, want, streams, body)
			require.JSONEq(t, body, string(got.Request))
		}
	})
	t.Run("UnknownAndMalformed", func(t *testing.T) {
		t.Parallel()
		for _, id := range []string{"0190a5b2-7c1e-7d3f-9a8b-123456789abc", "nope"} {
			_, _, err := b.Store.GetForStream(ctx, id, never)
			require.ErrorIs(t, err, jobs.ErrNotFound)
		}
	})
}
