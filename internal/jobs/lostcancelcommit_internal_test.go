package jobs

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// A page of CancelTenant commits and its answer is lost: its jobs are canceled, but the call
// neither counted nor aborted them, and fails. The operator runs it again: it cancels nothing
// more (it counts none twice), and aborts the task of the canceled job whose attempt may still
// be in flight (its lease not run out), which otherwise went on calling the provider until its
// lease's next renewal; a canceled job with no attempt in flight is not aborted. The rerun
// aborted nothing: it found every job ended.
func TestCancelTenant_PageWhoseCommitAnswerIsLostIsAbortedOnRerun(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, cutter, direct := newCutStore(t)
	p := cutTestParams
	p.Tenant = "acme"
	running, _, err := s.Create(ctx, p)
	require.NoError(t, err)
	_, err = s.BeginAttempt(ctx, running.ID)
	require.NoError(t, err)
	queued, _, err := s.Create(ctx, p)
	require.NoError(t, err)
	p.Tenant = "other" // another tenant's canceled job in flight: not this offboarding's
	others, _, err := s.Create(ctx, p)
	require.NoError(t, err)
	_, err = s.BeginAttempt(ctx, others.ID)
	require.NoError(t, err)
	_, err = s.Cancel(ctx, others.ID)
	require.NoError(t, err)

	var mu sync.Mutex
	aborted := map[string]int{}
	abort := func(j *Job) error {
		mu.Lock()
		defer mu.Unlock()
		aborted[j.ID]++
		return nil
	}
	settled := func() <-chan time.Time {
		ch := make(chan time.Time, 1)
		ch <- time.Now()
		return ch
	}

	// When the page's COMMIT commits and its answer is lost
	hold := cutter.HoldStatement("commit")
	type answer struct {
		n   int
		err error
	}
	done := make(chan answer, 1)
	go func() {
		n, err := s.CancelTenant(ctx, "acme", settled(), abort)
		done <- answer{n, err}
	}()
	select {
	case <-hold.Reached():
	case <-ctx.Done():
		t.Fatal("the page's commit was not sent")
	}
	cutter.LoseNextAnswer()
	hold.Release()
	var first answer
	select {
	case first = <-done:
	case <-ctx.Done():
		t.Fatal("CancelTenant did not return")
	}
	require.Error(t, first.err)
	require.Equal(t, 1, cutter.LostAnswers(), "the page's commit answer was dropped")
	var canceled int
	require.NoError(t, direct.QueryRow(ctx, `SELECT count(*) FROM jobs WHERE tenant = 'acme' AND status = 'canceled'`).Scan(&canceled))
	require.Equal(t, 2, canceled, "the page committed")
	mu.Lock()
	require.Empty(t, aborted, "the call heard of no job canceled")
	mu.Unlock()

	// Then a rerun (as package offboard runs it) cancels nothing more, and aborts the task of
	// the job in flight
	require.NoError(t, s.AbortInFlightOfTenant(ctx, "acme", abort))
	n, err := s.CancelTenant(ctx, "acme", settled(), abort)
	require.NoError(t, err)
	require.Zero(t, n, "nothing canceled anew")
	mu.Lock()
	require.Equal(t, map[string]int{running.ID: 1}, aborted, "the attempt in flight aborted; the queued job and another tenant's not")
	mu.Unlock()
	for _, id := range []string{running.ID, queued.ID} {
		var events int
		require.NoError(t, direct.QueryRow(ctx, `SELECT count(*) FROM job_events WHERE job_id = $1 AND type = 'canceled'`, id).Scan(&events))
		require.Equal(t, 1, events, "job %s canceled once", id)
	}
}
