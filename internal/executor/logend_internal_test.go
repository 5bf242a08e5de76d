package executor

import (
	"context"
	"io"
	"log/slog"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/jobs"
)

// TestExecutor_LogEndFreeWhenOff: a finished job's debug line costs nothing while the level is
// off, as it is by default (issue 23): building its attributes at every job's end boxed the
// job's id, credential and status and made their slice, logged or not.
func TestExecutor_LogEndFreeWhenOff(t *testing.T) { // not parallel: testing.AllocsPerRun
	e := &Executor{cfg: Config{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}}
	job := &jobs.Job{ID: "0195f4c2-7b1e-7000-8000-000000000001", Credential: "main", Attempts: 1}
	o := jobs.Outcome{Status: jobs.StatusSucceeded}
	allocs := testing.AllocsPerRun(100, func() { e.logEnd(context.Background(), job, o) })
	require.Zero(t, allocs, "allocations per finished job's log line at the info level")
}
