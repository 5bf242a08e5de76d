package jobs_test

import (
	"encoding/json"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/jobs"
	"github.com/llmq/llmq/internal/jobstest"
)

// TestStore_CancelsRacingEachOtherAndAFinish: cancels of one job sent at once (alone, beside its
// worker's finish of a running job, or beside its BeginAttempt of a queued one) end it exactly
// once: either one cancel answers the canceled job (the others AlreadyCanceled, the finish not
// applied) and one 'canceled' event is appended, or the finish applies and every cancel answers
// the TerminalError of its end, appending nothing. A cancel whose wait for the row's lock ended
// in another's end runs its statement again (cancelTries): with one run it answered an error.
func TestStore_CancelsRacingEachOtherAndAFinish(t *testing.T) {
	t.Parallel()
	b := jobstest.New(t)
	ctx := t.Context()
	const cancels = 4
	for round := range 12 {
		job := b.Create(t, jobstest.Opts{})
		withFinish, withBegin := round%3 == 0, round%3 == 1
		var running *jobs.Job
		if withFinish {
			var err error
			running, err = b.Store.BeginAttempt(ctx, job.ID)
			require.NoError(t, err)
		}

		var (
			wg      sync.WaitGroup
			start   = make(chan struct{})
			ours    = make(chan *jobs.Job, cancels)
			errs    = make(chan error, cancels)
			applied bool
			finErr  error
		)
		for range cancels {
			wg.Go(func() {
				<-start
				got, err := b.Store.Cancel(ctx, job.ID)
				if err != nil {
					errs <- err
					return
				}
				ours <- got
			})
		}
		if withFinish {
			wg.Go(func() {
				<-start
				applied, finErr = b.Store.Finish(ctx, job.ID, &jobs.Attempt{
					Number: running.Attempts, Credential: running.Credential, StartedAt: time.Now(),
					Latency: time.Millisecond, StatusCode: 200, Class: "retryable",
				}, jobs.Outcome{Status: jobs.StatusSucceeded, Result: json.RawMessage(`{}`)})
			})
		}
		var begun bool
		if withBegin {
			wg.Go(func() {
				<-start
				_, err := b.Store.BeginAttempt(ctx, job.ID)
				if begun = err == nil; !begun && !errors.Is(err, jobs.ErrNotRunnable) {
					finErr = err
				}
			})
		}
		close(start)
		wg.Wait()
		close(ours)
		close(errs)
		require.NoError(t, finErr)

		evs := b.Events(t, job.ID)
		want := 2 // queued, then its end
		if withFinish || begun {
			want = 3 // queued, running, its end
		}
		require.Len(t, evs, want, "round %d: events %v", round, evs)
		end := evs[len(evs)-1]
		var won []*jobs.Job
		for j := range ours {
			won = append(won, j)
		}
		for err := range errs {
			var te *jobs.TerminalError
			require.True(t, errors.As(err, &te), "round %d: %v", round, err)
			require.Equal(t, end, te.Status, "round %d", round)
			require.NotNil(t, te.Job)
			require.Equal(t, end, te.Job.Status)
		}
		switch end {
		case jobs.StatusCanceled:
			require.Len(t, won, 1, "round %d: cancels that answered the job canceled now", round)
			require.Equal(t, jobs.StatusCanceled, won[0].Status)
			require.False(t, applied, "round %d: the finish applied after the cancel", round)
		case jobs.StatusSucceeded:
			require.True(t, withFinish)
			require.Empty(t, won, "round %d", round)
			require.True(t, applied)
		default:
			t.Fatalf("round %d: ended %s", round, end)
		}
	}
}
