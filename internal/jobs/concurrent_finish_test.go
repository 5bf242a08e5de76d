package jobs_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/jobs"
	"github.com/llmq/llmq/internal/jobstest"
)

// TestStore_ConcurrentStatementsKeepTheirOwnValues: jobs begun, read and finished at once, their
// statements batched together, each get their own: a begin and a read answer their own job (a
// statement's scan writes into its own), and each Finish stores its own result, dead reason,
// attempt and event payload (the arguments boxed once and shared by every call, the empty
// event payload and the lease's length, are not written; one call's argument list is not
// another's). Run under the race detector.
func TestStore_ConcurrentStatementsKeepTheirOwnValues(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	b := jobstest.New(t)
	const n = 24
	ids := make([]string, n)
	for i := range ids {
		ids[i] = b.Create(t, jobstest.Opts{}).ID
	}
	// together runs f(i) for every job at once and returns each one's error.
	together := func(f func(i int) error) []error {
		errs := make([]error, n)
		start := make(chan struct{})
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() {
				<-start
				errs[i] = f(i)
			})
		}
		close(start)
		wg.Wait()
		return errs
	}

	begun := make([]*jobs.Job, n)
	read := make([]*jobs.Job, n)
	for i, err := range together(func(i int) (err error) {
		if begun[i], err = b.Store.BeginAttempt(ctx, ids[i]); err != nil {
			return err
		}
		read[i], err = b.Store.Get(ctx, ids[i])
		return err
	}) {
		require.NoError(t, err, "job %d", i)
		require.Equal(t, ids[i], begun[i].ID, "job %d: begun", i)
		require.NotNil(t, begun[i].LeaseToken, "job %d", i)
		require.Equal(t, ids[i], read[i].ID, "job %d: read", i)
		require.Equal(t, *begun[i].LeaseToken, *read[i].LeaseToken, "job %d", i)
	}

	started := time.Now().UTC().Truncate(time.Microsecond)
	for i, err := range together(func(i int) error {
		a := &jobs.Attempt{Number: 1, Credential: fmt.Sprintf("c-%d", i), StartedAt: started,
			Latency: time.Duration(i+1) * time.Millisecond, StatusCode: 200 + i, Class: "ok",
			LeaseToken: *begun[i].LeaseToken}
		o := jobs.Outcome{Status: jobs.StatusSucceeded, Result: json.RawMessage(fmt.Sprintf(`{"i":%d}`, i)),
			AnsweredBy: a.Credential}
		if i%2 == 1 {
			a.Class = "server_error"
			o = jobs.Outcome{Status: jobs.StatusDead, DeadReason: fmt.Sprintf("reason-%d", i),
				LastError: &jobs.LastError{Class: "server_error", Status: 500, Message: fmt.Sprintf("m-%d", i)}}
		}
		applied, err := b.Store.Finish(ctx, ids[i], a, o)
		if err == nil && !applied {
			err = fmt.Errorf("not applied")
		}
		return err
	}) {
		require.NoError(t, err, "job %d", i)
	}

	for i, id := range ids {
		got, err := b.Store.Get(ctx, id)
		require.NoError(t, err)
		events, err := b.Store.Events(ctx, id, 0)
		require.NoError(t, err)
		last := events[len(events)-1]
		attempts, err := b.Store.Attempts(ctx, id)
		require.NoError(t, err)
		require.Len(t, attempts, 1, "job %d", i)
		require.Equal(t, fmt.Sprintf("c-%d", i), attempts[0].Credential, "job %d", i)
		require.Equal(t, 200+i, *attempts[0].StatusCode, "job %d", i)
		require.InDelta(t, float64(i+1), attempts[0].LatencyMS, 0.001, "job %d", i)
		if i%2 == 0 {
			require.Equal(t, jobs.StatusSucceeded, got.Status, "job %d", i)
			require.JSONEq(t, fmt.Sprintf(`{"i":%d}`, i), string(got.Result), "job %d", i)
			require.Nil(t, got.DeadReason, "job %d", i)
			require.Equal(t, jobs.StatusSucceeded, last.Type, "job %d", i)
			require.JSONEq(t, `{}`, string(last.Payload), "job %d", i)
			continue
		}
		require.Equal(t, jobs.StatusDead, got.Status, "job %d", i)
		require.NotNil(t, got.DeadReason, "job %d", i)
		require.Equal(t, fmt.Sprintf("reason-%d", i), *got.DeadReason, "job %d", i)
		require.Equal(t, fmt.Sprintf("m-%d", i), got.LastError.Message, "job %d", i)
		require.Equal(t, jobs.StatusDead, last.Type, "job %d", i)
		require.JSONEq(t, fmt.Sprintf(`{"reason":"reason-%d"}`, i), string(last.Payload), "job %d", i)
	}
}
