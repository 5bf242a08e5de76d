package batchlane_test

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/batchlane"
	"github.com/llmq/llmq/internal/jobs"
	"github.com/llmq/llmq/internal/llm"
)

// TestBatcher_CrashBetweenCommitAndSend: the batch and its jobs are committed before the send.
// When the send fails without an answer (the process died, the connection dropped), the next
// pass looks the batch up at the provider: one the provider never got is sent then; one it got
// is adopted, not sent again. Either way each job is in exactly one provider batch, paid once.
func TestBatcher_CrashBetweenCommitAndSend(t *testing.T) {
	t.Parallel()
	for _, provider := range []string{"anthropic", "openai"} {
		for name, lost := range map[string]bool{"ProviderNeverGotIt": false, "ProviderGotIt": true} {
			t.Run(provider+"/"+name, func(t *testing.T) {
				t.Parallel()
				b := setup(t, setupOpts{provider: provider})
				j1, j2 := b.submit(t, "one", 0, 0), b.submit(t, "two", 0, 0)
				b.clock.Advance(fill)

				err := b.batcher(flaky{Client: b.client, lost: lost}).Once(context.Background())
				require.ErrorIs(t, err, context.DeadlineExceeded)
				refs := b.batchRefs(t)
				require.NotEmpty(t, refs[j1.ID], "committed before the send")
				require.Equal(t, refs[j1.ID], refs[j2.ID])
				got := b.get(t, j1.ID)
				require.Equal(t, jobs.StatusQueued, got.Status)
				require.Equal(t, "committed", *got.BatchState)
				wantCreated := map[bool]int{false: 0, true: 1}[lost]
				require.Equal(t, wantCreated, b.sim.BatchStats().Created)

				// A restarted leader (a new Batcher) resolves the batch, after the failed send's
				// backoff.
				b.clock.Advance(time.Minute)
				bt := b.batcher(nil)
				once(t, bt)
				st := b.sim.BatchStats()
				require.Equal(t, 1, st.Created, "the provider holds exactly one batch")
				require.Equal(t, 2, st.Requests, "each job sent once")
				require.Equal(t, refs, b.batchRefs(t), "the jobs stay in their batch")
				for _, id := range []string{j1.ID, j2.ID} {
					got := b.get(t, id)
					require.Equal(t, jobs.StatusRunning, got.Status)
					require.Equal(t, 1, got.Attempts)
				}

				b.clock.Advance(2 * time.Hour)
				once(t, bt)
				require.Equal(t, jobs.StatusSucceeded, b.get(t, j1.ID).Status)
				require.Equal(t, jobs.StatusSucceeded, b.get(t, j2.ID).Status)
				require.Equal(t, 1, b.sim.BatchStats().Created)
			})
		}
	}
}

// TestBatcher_LookUpPassesOverItsOwnBatches: Anthropic's batches keep no metadata, so a send
// whose answer was lost is looked up by its size and time. An earlier batch of llmq's of the same
// size, already recorded for its own jobs, is not it: adopted, the lost batch (paid for) would
// never be read and its jobs would be sent again.
func TestBatcher_LookUpPassesOverItsOwnBatches(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{provider: "anthropic"})
	a1, a2 := b.submit(t, "a1", 0, 0), b.submit(t, "a2", 0, 0)
	b.clock.Advance(fill)
	once(t, b.batcher(nil)) // batch A sent and recorded
	first := *b.get(t, a1.ID).BatchID
	b1, b2 := b.submit(t, "b1", 0, 0), b.submit(t, "b2", 0, 0)
	b.clock.Advance(fill)
	// Batch B, of the same size, reaches the provider; the answer is lost.
	require.Error(t, b.batcher(flaky{Client: b.client, lost: true}).Once(context.Background()))
	require.Equal(t, 2, b.sim.BatchStats().Created)

	b.clock.Advance(time.Minute) // past the failed send's backoff
	once(t, b.batcher(nil))      // B is looked up, not sent again
	require.NotEqual(t, first, *b.get(t, b1.ID).BatchID, "batch B adopted batch A's provider batch")
	require.Equal(t, 2, b.sim.BatchStats().Created)
	b.clock.Advance(2 * time.Hour)
	once(t, b.batcher(nil))
	for _, id := range []string{a1.ID, a2.ID, b1.ID, b2.ID} {
		got := b.get(t, id)
		require.Equal(t, jobs.StatusSucceeded, got.Status, "%s: %+v", id, got.LastError)
		require.Equal(t, 1, got.Attempts, "sent once")
	}
}

// TestBatcher_Cancel: a job canceled before its batch is sent leaves the batch (not paid for);
// one canceled after keeps its status when the batch's result comes (the result is discarded);
// a batch none of whose jobs still wait is canceled at the provider.
func TestBatcher_Cancel(t *testing.T) {
	t.Parallel()

	t.Run("BeforeSend", func(t *testing.T) {
		t.Parallel()
		b := setup(t, setupOpts{})
		keep, drop := b.submit(t, "keep", 0, 0), b.submit(t, "drop", 0, 0)
		b.clock.Advance(fill)
		crashed := b.batcher(nil)
		batchlane.CrashAfterCommit(crashed, context.Canceled)
		require.ErrorIs(t, crashed.Once(context.Background()), context.Canceled)
		require.Equal(t, "committed", *b.get(t, drop.ID).BatchState)
		_, err := b.store.Cancel(context.Background(), drop.ID)
		require.NoError(t, err)
		once(t, b.batcher(nil))
		require.Equal(t, 1, b.sim.BatchStats().Requests, "only the job still waiting is sent")
		require.Equal(t, jobs.StatusRunning, b.get(t, keep.ID).Status)
		got := b.get(t, drop.ID)
		require.Equal(t, jobs.StatusCanceled, got.Status)
		require.Nil(t, got.BatchID)
		require.Equal(t, "canceled", *got.BatchState)
	})

	t.Run("AfterSend", func(t *testing.T) {
		t.Parallel()
		b := setup(t, setupOpts{})
		bt := b.batcher(nil)
		keep, drop := b.submit(t, "keep", 0, 0), b.submit(t, "drop", 0, 0)
		b.clock.Advance(fill)
		once(t, bt)
		_, err := b.store.Cancel(context.Background(), drop.ID)
		require.NoError(t, err)
		b.clock.Advance(2 * time.Hour)
		once(t, bt)
		require.Equal(t, jobs.StatusSucceeded, b.get(t, keep.ID).Status)
		got := b.get(t, drop.ID)
		require.Equal(t, jobs.StatusCanceled, got.Status, "the result is discarded")
		require.Nil(t, got.Result)
		// The provider charged for the answer: its usage is the canceled job's, as an online
		// answer after a cancel. It was dropped (usage null).
		require.NotNil(t, got.Usage, "the answer's usage")
		var usage llm.Usage
		require.NoError(t, json.Unmarshal(got.Usage, &usage))
		require.Positive(t, usage.OutputTokens)
		require.Zero(t, b.sim.BatchStats().Cancels)
	})

	t.Run("AllCanceled", func(t *testing.T) {
		t.Parallel()
		b := setup(t, setupOpts{})
		bt := b.batcher(nil)
		j := b.submit(t, "x", 0, 0)
		b.clock.Advance(fill)
		once(t, bt)
		_, err := b.store.Cancel(context.Background(), j.ID)
		require.NoError(t, err)
		once(t, bt)
		require.Zero(t, b.sim.BatchStats().Cancels, "seen at the next poll")
		b.clock.Advance(30 * time.Second)
		once(t, bt)
		require.Equal(t, 1, b.sim.BatchStats().Cancels, "nothing waits for the batch: canceled at the provider")
		once(t, bt)
		require.Equal(t, 1, b.sim.BatchStats().Cancels, "once")
	})
}

// TestBatcher_DeadlineFallback: a job whose deadline comes within online_fallback while its
// batch has not ended goes to the online lane, and the batch's late result does not touch it;
// so does a job still waiting for a batch.
func TestBatcher_DeadlineFallback(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{delay: 5 * time.Hour})
	bt := b.batcher(nil)
	inBatch := b.submit(t, "x", 2*time.Hour, 0)
	b.clock.Advance(fill)
	once(t, bt)
	require.Equal(t, jobs.StatusRunning, b.get(t, inBatch.ID).Status)
	waiting := b.submit(t, "y", 90*time.Minute, 0)

	b.clock.Set(inBatch.Deadline.Add(-11 * time.Minute))
	once(t, bt)
	require.Equal(t, jobs.StatusRunning, b.get(t, inBatch.ID).Status, "not yet within online_fallback")
	require.Equal(t, []string{waiting.ID}, b.online(), "the waiting job's deadline is nearer: online")
	require.Equal(t, jobs.LaneOnline, b.get(t, waiting.ID).Lane)

	b.clock.Set(inBatch.Deadline.Add(-10 * time.Minute))
	once(t, bt)
	got := b.get(t, inBatch.ID)
	require.Equal(t, jobs.StatusRetrying, got.Status)
	require.Equal(t, jobs.LaneOnline, got.Lane)
	require.Equal(t, "deadline_fallback", got.LastError.Type)
	require.ElementsMatch(t, []string{waiting.ID, inBatch.ID}, b.online())

	b.clock.Advance(6 * time.Hour) // the batch ends: its result is discarded
	once(t, bt)
	got = b.get(t, inBatch.ID)
	require.Equal(t, jobs.StatusRetrying, got.Status)
	require.Nil(t, got.Result)
}

// TestBatcher_FallbackTakesTheAnswerOfABatchThatEnded: a job whose batch ended at the provider
// before the job's online_fallback, polled only at that fallback, takes its batch's answer: its
// batch has ended, so it is not sent online to be paid for again with the answer discarded.
func TestBatcher_FallbackTakesTheAnswerOfABatchThatEnded(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{delay: 90 * time.Minute})
	bt := b.batcher(nil)
	job := b.submit(t, "x", 2*time.Hour, 0)
	b.clock.Advance(fill)
	once(t, bt)
	require.Equal(t, jobs.StatusRunning, b.get(t, job.ID).Status)

	b.clock.Set(job.Deadline.Add(-10 * time.Minute)) // the batch ended 18 minutes before
	once(t, bt)
	got := b.get(t, job.ID)
	require.Equal(t, jobs.StatusSucceeded, got.Status)
	require.NotNil(t, got.CostClass)
	require.Equal(t, "batch", *got.CostClass)
	require.Empty(t, b.online(), "not sent online: its answer is there, paid for")
	require.Equal(t, 1.0, b.counter(t, "jobs", "succeeded"))
	require.Zero(t, b.sim.BatchStats().Cancels, "an ended batch is not canceled")
}

// TestBatcher_FallbackWhoseResultsFailGoesOnline: a job at its fallback whose batch ended but
// whose results cannot be read goes online: they may not be read before its deadline.
func TestBatcher_FallbackWhoseResultsFailGoesOnline(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{delay: 90 * time.Minute, front: func(sim http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if strings.HasSuffix(r.URL.Path, "/results") {
				http.Error(w, `{"type":"error","error":{"type":"api_error","message":"down"}}`, http.StatusInternalServerError)
				return
			}
			sim.ServeHTTP(w, r)
		})
	}})
	bt := b.batcher(nil)
	job := b.submit(t, "x", 2*time.Hour, 0)
	b.clock.Advance(fill)
	once(t, bt)

	b.clock.Set(job.Deadline.Add(-10 * time.Minute))
	require.Error(t, bt.Once(context.Background()), "the results failed")
	got := b.get(t, job.ID)
	require.Equal(t, jobs.StatusRetrying, got.Status)
	require.Equal(t, jobs.LaneOnline, got.Lane)
	require.Equal(t, "deadline_fallback", got.LastError.Type)
	require.Equal(t, []string{job.ID}, b.online())
}

// TestBatcher_UnsentBatchDeadlineFallback: while the provider's batch API fails every send (a
// 5xx: sent again on each pass), a job of the batch whose deadline comes near goes online; the
// batch, sent at last, is recognised by its frozen size and its other job is not paid twice.
func TestBatcher_UnsentBatchDeadlineFallback(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	soon, later := b.submit(t, "soon", time.Hour, 0), b.submit(t, "later", 0, 0)
	b.clock.Advance(fill)
	// The provider got the batch; the answer was lost. Then its batch API is down a while.
	require.Error(t, b.batcher(flaky{Client: b.client, lost: true}).Once(context.Background()))
	require.Equal(t, 1, b.sim.BatchStats().Created)

	b.clock.Set(soon.Deadline.Add(-10 * time.Minute))
	require.Error(t, b.batcher(unreachable{b.client}).Once(context.Background()))
	got := b.get(t, soon.ID)
	require.Equal(t, jobs.LaneOnline, got.Lane)
	require.Equal(t, "deadline_fallback", got.LastError.Type)
	require.Equal(t, []string{soon.ID}, b.online())

	b.clock.Advance(time.Minute) // past the failed look-up's backoff
	once(t, b.batcher(nil))
	require.Equal(t, 1, b.sim.BatchStats().Created, "found by its frozen size of two: not sent again")
	require.Equal(t, jobs.StatusRunning, b.get(t, later.ID).Status)
}

// unreachable is a Client whose provider's batch API does not answer.
type unreachable struct{ batchlane.Client }

func (unreachable) Find(context.Context, string, time.Time, int, func(string) bool) (string, error) {
	return "", &batchlane.StatusError{Status: 503, Body: "unavailable"}
}

// TestBatcher_LostSendFoundPastTheFirstPage: a send whose answer was lost is found however
// many batches the key made since (here 150, more than a page of the list): before, the look-up
// read one page of 100, missed it, and sent the batch again, each job in two provider batches,
// paid twice.
func TestBatcher_LostSendFoundPastTheFirstPage(t *testing.T) {
	t.Parallel()
	for _, provider := range []string{"openai", "anthropic"} {
		t.Run(provider, func(t *testing.T) {
			t.Parallel()
			b := setup(t, setupOpts{provider: provider})
			j1, j2 := b.submit(t, "one", 0, 0), b.submit(t, "two", 0, 0)
			b.clock.Advance(fill)
			require.Error(t, b.batcher(flaky{Client: b.client, lost: true}).Once(context.Background()))
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			submitN(ctx, t, b.client, provider, "elsewhere", 150, 1) // the key's other batches, made meanwhile

			b.clock.Advance(time.Minute) // past the failed send's backoff
			once(t, b.batcher(nil))
			st := b.sim.BatchStats()
			require.Equal(t, 151, st.Created, "the lost send was adopted, not sent again")
			require.Equal(t, 152, st.Requests)
			for _, id := range []string{j1.ID, j2.ID} {
				got := b.get(t, id)
				require.Equal(t, jobs.StatusRunning, got.Status)
				require.Equal(t, 1, got.Attempts)
			}
		})
	}
}

// TestBatcher_LostSendOfAShrunkBatchIsFound: a batch whose first send failed loses the jobs
// whose deadline came near meanwhile (they go online), so its next send holds fewer requests
// than the batch froze. When that smaller send reaches Anthropic and its answer is lost, the
// look-up must still recognise it: sent again, its jobs would be in two batches, paid twice.
func TestBatcher_LostSendOfAShrunkBatchIsFound(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{provider: "anthropic"})
	// near's fallback (deadline less online_fallback) comes 15 s after the first send.
	near := b.submit(t, "near", fill+b.cfg.OnlineFallback+15*time.Second, 0)
	j1, j2 := b.submit(t, "one", 0, 0), b.submit(t, "two", 0, 0)
	b.clock.Advance(fill)

	// Send 1 never reaches the provider; its backoff is 30 s.
	require.ErrorIs(t, b.batcher(flaky{Client: b.client}).Once(context.Background()), context.DeadlineExceeded)
	require.Zero(t, b.sim.BatchStats().Created)
	// Within the backoff, near's fallback comes: it leaves the unsent batch for the online lane.
	b.clock.Advance(25 * time.Second)
	once(t, b.batcher(nil))
	require.Equal(t, []string{near.ID}, b.online())
	// Send 2, of the two jobs left, reaches the provider; its answer is lost.
	b.clock.Advance(10 * time.Second)
	require.ErrorIs(t, b.batcher(flaky{Client: b.client, lost: true}).Once(context.Background()), context.DeadlineExceeded)
	require.Equal(t, 1, b.sim.BatchStats().Created)

	// The next send looks the batch up and adopts it.
	b.clock.Advance(2 * time.Minute)
	once(t, b.batcher(nil))
	st := b.sim.BatchStats()
	require.Equal(t, 1, st.Created, "the lost send was sent again: its jobs are paid twice")
	require.Equal(t, 2, st.Requests)
	b.clock.Advance(2 * time.Hour)
	once(t, b.batcher(nil))
	for _, id := range []string{j1.ID, j2.ID} {
		got := b.get(t, id)
		require.Equal(t, jobs.StatusSucceeded, got.Status, "%s: %+v", id, got.LastError)
		require.Equal(t, 1, got.Attempts)
	}
}

// TestBatcher_CanceledBetweenSendsIsNotSent: a job canceled after its batch's first send
// failed is not in the send made again: it would be paid for, its result thrown away. Should
// every job of the batch be canceled, nothing is sent; a send that was lost is still looked up
// first, and found, it is canceled at the provider.
func TestBatcher_CanceledBetweenSendsIsNotSent(t *testing.T) {
	t.Parallel()
	for _, provider := range []string{"anthropic", "openai"} {
		t.Run(provider, func(t *testing.T) {
			t.Parallel()
			b := setup(t, setupOpts{provider: provider})
			keep, drop := b.submit(t, "keep", 0, 0), b.submit(t, "drop", 0, 0)
			b.clock.Advance(fill)
			require.Error(t, b.batcher(flaky{Client: b.client}).Once(context.Background()))
			_, err := b.store.Cancel(context.Background(), drop.ID)
			require.NoError(t, err)
			b.clock.Advance(time.Minute)
			once(t, b.batcher(nil))
			require.Equal(t, 1, b.sim.BatchStats().Requests, "the canceled job was sent")
			b.clock.Advance(2 * time.Hour)
			once(t, b.batcher(nil))
			require.Equal(t, jobs.StatusSucceeded, b.get(t, keep.ID).Status)
			require.Equal(t, jobs.StatusCanceled, b.get(t, drop.ID).Status)
		})
	}
	t.Run("AllCanceledAfterALostSend", func(t *testing.T) {
		t.Parallel()
		b := setup(t, setupOpts{})
		j1, j2 := b.submit(t, "one", 0, 0), b.submit(t, "two", 0, 0)
		b.clock.Advance(fill)
		require.Error(t, b.batcher(flaky{Client: b.client, lost: true}).Once(context.Background()))
		for _, id := range []string{j1.ID, j2.ID} {
			_, err := b.store.Cancel(context.Background(), id)
			require.NoError(t, err)
		}
		b.clock.Advance(time.Minute)
		bt := b.batcher(nil)
		once(t, bt) // found, not sent again
		require.Equal(t, 1, b.sim.BatchStats().Created)
		b.clock.Advance(time.Minute)
		once(t, bt) // nothing waits for it: canceled at the provider
		require.Equal(t, 1, b.sim.BatchStats().Cancels)
	})
	t.Run("AllCanceledNoneSent", func(t *testing.T) {
		t.Parallel()
		b := setup(t, setupOpts{})
		j := b.submit(t, "one", 0, 0)
		b.clock.Advance(fill)
		require.Error(t, b.batcher(flaky{Client: b.client}).Once(context.Background()))
		_, err := b.store.Cancel(context.Background(), j.ID)
		require.NoError(t, err)
		b.clock.Advance(time.Minute)
		once(t, b.batcher(nil))
		require.Zero(t, b.sim.BatchStats().Created, "a batch of canceled jobs was sent")
		var state string
		require.NoError(t, b.pool.QueryRow(context.Background(), `SELECT state FROM provider_batches`).Scan(&state))
		require.Equal(t, "canceled", state)
	})
}

// TestBatcher_LostSendIsNotConfusedWithAnotherLostBatch: two of llmq's batches of one
// Anthropic key are both in the crash window, so neither's provider batch is recorded (taken)
// yet. Batch A froze 5 jobs, lost 2 online before its second send (3 requests, lost), and
// one more to a cancel; batch B (4 requests) was sent, and lost, between A's sends. A's
// look-up must find its own last send, not B's (whose size lies between what A froze and
// what it has left): adopting B's, A's jobs would find no line and go round again, its real
// batch unread and paid for, and B, its batch taken, would be sent again: paid twice.
func TestBatcher_LostSendIsNotConfusedWithAnotherLostBatch(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{provider: "anthropic", maxReqs: 5})
	// near's fallback (deadline less online_fallback) comes 15 s after A's first send.
	near := fill + b.cfg.OnlineFallback + 15*time.Second
	var a []string
	for i := range 5 {
		timeout := time.Duration(0)
		if i >= 3 {
			timeout = near
		}
		a = append(a, b.submit(t, "a"+string(rune('0'+i)), timeout, 0).ID)
	}
	b.clock.Advance(fill)
	// A's first send (5 requests) never reaches the provider; its backoff is 30 s.
	require.Error(t, b.batcher(flaky{Client: b.client}).Once(context.Background()))
	require.Zero(t, b.sim.BatchStats().Created)

	// Within A's backoff its near jobs go online, and B is made and sent, its answer lost.
	var bIDs []string
	for i := range 4 {
		bIDs = append(bIDs, b.submit(t, "b"+string(rune('0'+i)), 0, 0).ID)
	}
	b.clock.Advance(25 * time.Second)
	require.Error(t, b.batcher(flaky{Client: b.client, lost: true}).Once(context.Background()))
	require.ElementsMatch(t, a[3:], b.online())
	require.Equal(t, 1, b.sim.BatchStats().Created)

	// A's second send (3 requests) reaches the provider; its answer is lost.
	b.clock.Advance(10 * time.Second)
	_ = b.batcher(flaky{Client: b.client, lost: true}).Once(context.Background())
	require.Equal(t, 2, b.sim.BatchStats().Created, "A's look-up adopted B's batch: A was not sent")
	_, err := b.store.Cancel(context.Background(), a[2])
	require.NoError(t, err)

	// Both look their batch up, and adopt their own.
	b.clock.Advance(2 * time.Minute)
	once(t, b.batcher(nil))
	require.Equal(t, 2, b.sim.BatchStats().Created, "a lost batch was sent again: its jobs are paid twice")
	b.clock.Advance(2 * time.Hour)
	once(t, b.batcher(nil))
	for _, id := range append(a[:2], bIDs...) {
		got := b.get(t, id)
		require.Equal(t, jobs.StatusSucceeded, got.Status, "%s: %+v", id, got.LastError)
		require.Equal(t, 1, got.Attempts)
	}
}
