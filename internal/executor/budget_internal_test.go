package executor

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/jobs"
	"github.com/llmq/llmq/internal/retrypolicy"
)

func TestDrawsOnRetryBudget(t *testing.T) {
	t.Parallel()
	lastErr := func(c retrypolicy.Class) *jobs.LastError { return &jobs.LastError{Class: string(c)} }
	for _, tc := range []struct {
		name string
		job  jobs.Job
		want bool
	}{
		{"server error", jobs.Job{Status: jobs.StatusRetrying, LastError: lastErr(retrypolicy.ClassRetryable)}, true},
		{"network", jobs.Job{Status: jobs.StatusRetrying, LastError: lastErr(retrypolicy.ClassNetwork)}, true},
		{"timeout (its own budget)", jobs.Job{Status: jobs.StatusRetrying, LastError: lastErr(retrypolicy.ClassTimeout)}, true},
		{"429 with Retry-After: the limiter paces it", jobs.Job{Status: jobs.StatusRetrying, LastError: lastErr(retrypolicy.ClassRateLimited)}, false},
		{"outcome never recorded: the worker died", jobs.Job{Status: jobs.StatusRunning, LastError: lastErr(retrypolicy.ClassRetryable)}, false},
		{"call cut as its worker stopped, or lost and moved while its credential was paused", jobs.Job{Status: jobs.StatusRetrying, LastError: lastErr(retrypolicy.ClassCanceled)}, false},
		{"re-queued dead letter", jobs.Job{Status: jobs.StatusQueued}, true},
		{"failed over for a size refusal", jobs.Job{Status: jobs.StatusRetrying, LastError: lastErr(retrypolicy.ClassPermanent)}, false},
		{"failed over for a spend cap", jobs.Job{Status: jobs.StatusRetrying, LastError: lastErr(retrypolicy.ClassSpendCap)}, false},
		{"dead letter of a spend cap, re-queued", jobs.Job{Status: jobs.StatusQueued, LastError: lastErr(retrypolicy.ClassSpendCap)}, true},
	} {
		require.Equal(t, tc.want, drawsOnRetryBudget(&tc.job), tc.name)
	}
}

func TestLeasedDefer(t *testing.T) {
	t.Parallel()
	now := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	// A long lease: look again after leaseRecheck, in case the holder finishes early.
	require.Equal(t, now.Add(leaseRecheck), leasedDefer(now, now.Add(jobs.AttemptLease)).until)
	// A lease about to end: come back when it does.
	require.Equal(t, now.Add(time.Second), leasedDefer(now, now.Add(time.Second)).until)
}
