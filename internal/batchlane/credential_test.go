package batchlane_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/batchlane"
	"github.com/llmq/llmq/internal/jobs"
)

// TestBatcher_AttemptsNameTheBatchCredential: a batch-lane job that names fallbacks runs every
// round on its own credential, the one the batcher selects it by (jobs.credential) and its batch
// is sent on (provider_batches.credential), never on a fallback, even with a batch lane enabled
// on that fallback: only the online executor fails over (credential_index), and a job that left
// the batch lane never comes back to it. So each round's attempt row, its answer's answered_by
// and the per-credential batch metrics name that credential, which is also the job's current one
// (credential_index 0), as an online attempt row names the credential it was sent on.
func TestBatcher_AttemptsNameTheBatchCredential(t *testing.T) {
	t.Parallel()
	for _, provider := range []string{"anthropic", "openai"} {
		t.Run(provider, func(t *testing.T) {
			t.Parallel()
			b := setup(t, setupOpts{provider: provider})
			// One batcher with both lanes, as a process configures them (a batcher lacking a
			// lane sends that credential's waiting jobs online).
			bt := batchlane.New(batchlane.Config{Pool: b.pool, Now: b.clock.Now, Metrics: b.metrics, Enqueue: b.enqueue,
				Lanes: []batchlane.Lane{{Credential: "default", Client: b.client, Config: b.cfg},
					{Credential: "spare", Client: b.client, Config: b.cfg}}})
			ok := b.submitWithFallback(t, "one", 72*time.Hour, 3)
			failing := b.submitWithFallback(t, "llmsim-batch-server-error", 72*time.Hour, 2) // each round errored, retryable

			b.clock.Advance(fill)
			once(t, bt) // sent
			require.Equal(t, 1, b.sim.BatchStats().Created, "one batch, the own credential's")
			for round := 1; round <= 2; round++ {
				b.clock.Advance(2 * time.Hour)
				once(t, bt) // ended; the failing job, within its attempts, goes in the next batch
			}
			require.Equal(t, 2, b.sim.BatchStats().Created)

			got := b.get(t, ok.ID)
			require.Equal(t, jobs.StatusSucceeded, got.Status, "%+v", got.LastError)
			require.Equal(t, "default", *got.AnsweredBy)
			require.Equal(t, "default", got.CurrentCredential())
			got = b.get(t, failing.ID)
			require.Equal(t, jobs.StatusDead, got.Status, "%+v", got.LastError)
			require.Equal(t, jobs.ReasonRetriesExhausted, *got.DeadReason)
			require.Zero(t, got.CredentialIndex, "the batch lane never fails over")
			require.Equal(t, "default", got.CurrentCredential())

			for id, rounds := range map[string]int{ok.ID: 1, failing.ID: 2} {
				attempts, err := b.store.Attempts(t.Context(), id)
				require.NoError(t, err)
				require.Len(t, attempts, rounds)
				for _, a := range attempts {
					require.Equal(t, "default", a.Credential, "attempt %d", a.Number)
				}
			}
			var batchCreds []string
			rows, err := b.pool.Query(t.Context(), `SELECT credential FROM provider_batches ORDER BY submitted_at`)
			require.NoError(t, err)
			defer rows.Close()
			for rows.Next() {
				var c string
				require.NoError(t, rows.Scan(&c))
				batchCreds = append(batchCreds, c)
			}
			require.NoError(t, rows.Err())
			require.Equal(t, []string{"default", "default"}, batchCreds)
			require.Equal(t, 2.0, b.counter(t, "batches", "sent"))
		})
	}
}

// TestBatcher_StaleWaitingReadLeavesAnOnlineJobAlone: two leaders' passes overlap (a lock cut,
// see TestBatcher_LeaderCutMidSendSendsOnce). Both read a job waiting for a batch; the new one
// sends it online, where the executor fails it over to its fallback and begins its attempt
// there. The old pass's move, made on what it read, must find the job gone from the batch lane:
// applied, it wrote an attempt row of its own under the attempt's number (naming the job's own
// credential, not the fallback the call runs on, and dated nowhere), which made the executor's
// Finish of that attempt a repeat that records nothing, and put the running job back to queued
// for a second delivery beside the call in flight.
func TestBatcher_StaleWaitingReadLeavesAnOnlineJobAlone(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	// Both within online_fallback of their deadline: a pass sends them online.
	first := b.submitWithFallback(t, "one", 5*time.Minute, 3)
	second := b.submitWithFallback(t, "two", 5*time.Minute, 3)
	newLeader := b.batcher(nil)
	var began *jobs.Job
	var stale []string
	// The old leader hands its first job online only after the new leader's pass and the
	// executor's failover and attempt of the second job: its read of the second is stale.
	old := batchlane.New(batchlane.Config{Pool: b.pool, Now: b.clock.Now,
		Lanes: []batchlane.Lane{{Credential: "default", Client: b.client, Config: b.cfg}},
		Enqueue: func(ctx context.Context, id string, _ jobs.Priority) error {
			stale = append(stale, id)
			if id != first.ID {
				return nil
			}
			once(t, newLeader)
			moved, err := b.store.NextCredential(ctx, second.ID, 0)
			require.NoError(t, err)
			require.True(t, moved)
			began, err = b.store.BeginAttempt(ctx, second.ID)
			require.NoError(t, err)
			return nil
		}})
	once(t, old)
	require.NotNil(t, began, "the old pass handed the first job online")

	got := b.get(t, second.ID)
	require.Equal(t, jobs.StatusRunning, got.Status, "the executor's attempt holds the job")
	require.Equal(t, jobs.LaneOnline, got.Lane)
	require.Equal(t, "spare", got.CurrentCredential())
	attempts, err := b.store.Attempts(t.Context(), second.ID)
	require.NoError(t, err)
	require.Empty(t, attempts, "no attempt row but the executor's, when it finishes")
	require.Equal(t, []string{first.ID}, stale, "the second job is handed online once, by the new leader")

	// The executor's attempt is recorded, under the credential it ran on.
	applied, err := b.store.Finish(t.Context(), second.ID, &jobs.Attempt{Number: began.Attempts, Credential: "spare",
		StartedAt: b.clock.Now(), Class: "ok", LeaseToken: *began.LeaseToken},
		jobs.Outcome{Status: jobs.StatusSucceeded, Result: []byte(`{}`), AnsweredBy: "spare"})
	require.NoError(t, err)
	require.True(t, applied)
	attempts, err = b.store.Attempts(t.Context(), second.ID)
	require.NoError(t, err)
	require.Len(t, attempts, 1)
	require.Equal(t, "spare", attempts[0].Credential)
	require.Equal(t, "spare", *b.get(t, second.ID).AnsweredBy)
}

// submitWithFallback stores a batch-lane job of the default credential, with fallback "spare",
// whose user text is text (plain: nothing to escape in JSON).
func (b *testBundle) submitWithFallback(t *testing.T, text string, timeout time.Duration, maxAttempts int) *jobs.Job {
	t.Helper()
	req := `{"model":"claude-sim","max_tokens":64,"messages":[{"role":"user","content":"` + text + `"}]}`
	if b.provider == "openai" {
		req = `{"model":"gpt-sim","messages":[{"role":"user","content":"` + text + `"}]}`
	}
	j, _, err := b.store.Create(t.Context(), jobs.CreateParams{Tenant: "default", Credential: "default",
		Fallbacks: []string{"spare"}, Request: []byte(req), MaxAttempts: maxAttempts, Timeout: timeout,
		Lane: jobs.LaneBatch})
	require.NoError(t, err)
	b.catchUp(j)
	return j
}
