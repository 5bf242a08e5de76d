package executor

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/jobs"
	"github.com/llmq/llmq/internal/logtest"
	"github.com/llmq/llmq/internal/logthrottle"
)

// TestExecutor_LogEndFreeWhenOff: a finished job's debug line costs nothing while the level is
// off, as it is by default: building its attributes at every job's end boxed the
// job's id, credential and status and made their slice, logged or not.
func TestExecutor_LogEndFreeWhenOff(t *testing.T) { // not parallel: testing.AllocsPerRun
	e := &Executor{cfg: Config{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}}
	job := &jobs.Job{ID: "0195f4c2-7b1e-7000-8000-000000000001", Credential: "main", Attempts: 1}
	o := jobs.Outcome{Status: jobs.StatusSucceeded}
	allocs := testing.AllocsPerRun(100, func() { e.logEnd(context.Background(), job, o) })
	require.Zero(t, allocs, "allocations per finished job's log line at the info level")
}

// TestExecutor_LogEndThrottlesOnlyUnconfigured: only the dead letters of a credential missing
// from the config (credential_not_configured) are throttled per credential; those of the other
// reasons keep a line each, whatever their number.
func TestExecutor_LogEndThrottlesOnlyUnconfigured(t *testing.T) {
	t.Parallel()
	var logs logtest.Buffer
	now := time.Now()
	e := &Executor{cfg: Config{Logger: slog.New(slog.NewTextHandler(&logs, nil))},
		unconfiguredLog: logthrottle.New(&logthrottle.Config{Every: time.Minute,
			Now: func() time.Time { return now }})}
	t.Cleanup(e.Stop)
	dead := func(reason string) jobs.Outcome {
		return jobs.Outcome{Status: jobs.StatusDead, DeadReason: reason,
			LastError: &jobs.LastError{Class: "permanent"}}
	}
	job := &jobs.Job{ID: "0195f4c2-7b1e-7000-8000-000000000001", Credential: "main", Attempts: 3}
	for range 3 {
		e.logEnd(t.Context(), job, dead(jobs.ReasonRetriesExhausted))
		e.logEnd(t.Context(), job, dead(jobs.ReasonCredentialNotConfigured))
	}
	require.Equal(t, 3, logs.Count("reason="+jobs.ReasonRetriesExhausted), logs.String())
	require.Equal(t, 1, logs.Count("reason="+jobs.ReasonCredentialNotConfigured), logs.String())
}
