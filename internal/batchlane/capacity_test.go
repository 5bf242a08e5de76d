package batchlane_test

import (
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/batchlane"
	"github.com/llmq/llmq/internal/jobs"
)

// TestBatcher_CapacityRoundsKeepTheirAttempts: a request an ended batch answered with the
// provider's capacity (a 429, Anthropic's 529 overloaded_error, OpenAI's 503) did not run for
// anything the job did, and the batch lane cannot pace its requests as the online limiter paces
// calls: the round gives its attempt back. A job with one attempt went dead retries_exhausted
// after a single such round; it now goes round again, each round on its own attempt row, and
// keeps its attempts for a round that can fail for its own sake. Its deadline and
// max_attempts bound the rounds (TestBatcher_CapacityGiveBacksAreBounded).
func TestBatcher_CapacityRoundsKeepTheirAttempts(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ name, provider, marker string }{
		{"AnthropicRateLimited", "anthropic", "llmsim-batch-rate-limited"},
		{"AnthropicOverloaded", "anthropic", "llmsim-batch-overloaded"},
		{"OpenAIOverloaded", "openai", "llmsim-batch-overloaded"},
		{"OpenAIRateLimited", "openai", "llmsim-batch-rate-limited"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, setupOpts{provider: tc.provider})
			bt := b.batcher(nil)
			j := b.submit(t, tc.marker, 72*time.Hour, 2)
			b.clock.Advance(fill)
			once(t, bt) // sent
			for round := 1; round <= 2; round++ {
				// The batch ends, its request refused for the provider's capacity; the job,
				// its deadline leaving room for another window, goes in the pass's next batch.
				b.clock.Advance(2 * time.Hour)
				once(t, bt)
				got := b.get(t, j.ID)
				require.Equal(t, jobs.StatusRunning, got.Status, "round %d: %+v", round, got.LastError)
				require.Empty(t, got.DeadReason)
				require.Equal(t, jobs.LaneBatch, got.Lane, "round %d", round)
				require.Equal(t, 1, got.Attempts, "round %d: the ended round's attempt was given back", round)
			}
			require.Equal(t, []string{"queued", "running", "retrying", "running", "retrying", "running"},
				b.events(t, j.ID))
			attempts, err := b.store.Attempts(t.Context(), j.ID)
			require.NoError(t, err)
			require.Len(t, attempts, 2, "each ended round keeps its attempt row")
			require.Equal(t, []int{1, 2}, []int{attempts[0].Number, attempts[1].Number})
			require.Equal(t, 3, b.sim.BatchStats().Created)
		})
	}
}

// TestBatcher_FailedBatchKeepsItsAttempts: an OpenAI batch that failed as a whole for a batch
// quota (its enqueued token limit) ran none of its requests: its jobs go online without an
// attempt counted, so a job with one attempt gets its call there instead of going dead
// retries_exhausted for a call never made.
func TestBatcher_FailedBatchKeepsItsAttempts(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{provider: "openai", enqueuedTokens: 150})
	bt := b.batcher(nil)
	b.submit(t, strings.Repeat("a", 400), 0, 0) // 100 tokens
	b.clock.Advance(fill)
	once(t, bt)
	second := b.submit(t, strings.Repeat("b", 400), 0, 1) // 100 more: past the limit
	b.clock.Advance(fill)
	once(t, bt)
	b.clock.Advance(time.Minute) // the second batch's first poll: failed
	once(t, bt)
	got := b.get(t, second.ID)
	require.Equal(t, jobs.StatusRetrying, got.Status, "%+v", got.LastError)
	require.Empty(t, got.DeadReason)
	require.Equal(t, jobs.LaneOnline, got.Lane)
	require.Equal(t, 0, got.Attempts)
	require.Equal(t, "token_limit_exceeded", got.LastError.Type)
	require.Equal(t, []string{second.ID}, b.online())
}

// TestBatcher_JobsUsageIsItsAnswers: the batch lane writes a job's usage as the online lane's
// Finish does, its answer's (none for an answer that reported none, or a round without one),
// never a usage the job had before: a job retried from the dead letters by a release that kept
// its old round's usage there (RetryDead clears it now) showed that usage as its new answer's.
func TestBatcher_JobsUsageIsItsAnswers(t *testing.T) {
	t.Parallel()
	noUsage := regexp.MustCompile(`"usage":\{[^{}]*\}`)
	front := &resultsFront{edit: func(_ int, body []byte) ([]byte, bool) {
		return noUsage.ReplaceAll(body, []byte(`"usage":null`)), false
	}}
	b := setup(t, setupOpts{front: front.wrap})
	bt := b.batcher(nil)
	answered := b.submit(t, "fine", 0, 0)
	busy := b.submit(t, "llmsim-batch-overloaded", 0, 0)
	for _, id := range []string{answered.ID, busy.ID} {
		_, err := b.pool.Exec(t.Context(),
			`UPDATE jobs SET usage = '{"input_tokens":7,"output_tokens":3}' WHERE id = $1`, id)
		require.NoError(t, err)
	}
	b.clock.Advance(fill)
	once(t, bt)
	b.clock.Advance(2 * time.Hour)
	once(t, bt)
	got := b.get(t, answered.ID)
	require.Equal(t, jobs.StatusSucceeded, got.Status, "%+v", got.LastError)
	require.Nil(t, got.Usage, "an answer without usage kept the job's earlier usage")
	got = b.get(t, busy.ID)
	require.Equal(t, jobs.StatusRetrying, got.Status, "%+v", got.LastError)
	require.Nil(t, got.Usage, "a round without an answer kept the job's earlier usage")
}

// TestBatcher_CapacityGiveBacksAreBounded: a job gives back at most max_attempts rounds the
// provider refused for its capacity; after that such a round counts as before. A provider
// that ends each batch within a minute, every request refused, sent a job with a long timeout
// round every MaxWaitToFill + PollInterval until its deadline fallback: hundreds of batches
// and attempt rows for one job, which max_attempts bounded before.
func TestBatcher_CapacityGiveBacksAreBounded(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	bt := b.batcher(nil)
	j := b.submit(t, "llmsim-batch-overloaded", 72*time.Hour, 1)
	b.clock.Advance(fill)
	once(t, bt) // sent
	b.clock.Advance(2 * time.Hour)
	once(t, bt) // refused, given back: sent again
	got := b.get(t, j.ID)
	require.Equal(t, jobs.StatusRunning, got.Status, "%+v", got.LastError)
	require.Equal(t, 1, got.Attempts)
	b.clock.Advance(2 * time.Hour)
	once(t, bt) // refused again: max_attempts (1) given back already, so it counts
	got = b.get(t, j.ID)
	require.Equal(t, jobs.StatusDead, got.Status, "%+v", got.LastError)
	require.NotNil(t, got.DeadReason)
	require.Equal(t, "retries_exhausted", *got.DeadReason)
	require.Equal(t, 1, got.Attempts)
	attempts, err := b.store.Attempts(t.Context(), j.ID)
	require.NoError(t, err)
	require.Len(t, attempts, 2)
}

// TestBatcher_ExpiredRoundsGiveTheirAttemptBack: a request the provider ended expired (its
// batch's window passed before it ran it) was never called, as one refused for the provider's
// capacity: its round gives its attempt back, and the job goes online (the batch lane could not
// make it) with its attempts whole. A job with one attempt went dead retries_exhausted after a
// single expired round, though no call of it was made. The bound is the capacity rounds': a job
// with max_attempts attempt rows refused for the provider's capacity (in either lane; an
// expired round's row counts as one) already, an expired round counts.
func TestBatcher_ExpiredRoundsGiveTheirAttemptBack(t *testing.T) {
	t.Parallel()
	for _, provider := range []string{"anthropic", "openai"} {
		t.Run(provider, func(t *testing.T) {
			t.Parallel()
			b := setup(t, setupOpts{provider: provider})
			bt := b.batcher(nil)
			j := b.submit(t, "llmsim-batch-expire", 72*time.Hour, 1)
			spent := b.submit(t, "llmsim-batch-expire", 72*time.Hour, 1)
			// spent's one give-back went to an online 503 (its attempt_base keeps its number).
			_, err := b.pool.Exec(t.Context(), `
WITH a AS (INSERT INTO job_attempts (job_id, attempt, credential, started_at, latency_ms, status_code, class, error)
	VALUES ($1, 1, 'default', now(), 10, 503, 'retryable', 'overloaded'))
UPDATE jobs SET attempt_base = 1 WHERE id = $1`, spent.ID)
			require.NoError(t, err)
			// expiredBefore's went to an expired round: the bound counts its row as well.
			expiredBefore := b.submit(t, "llmsim-batch-expire", 72*time.Hour, 1)
			_, err = b.pool.Exec(t.Context(), `
WITH a AS (INSERT INTO job_attempts (job_id, attempt, credential, started_at, latency_ms, class, error)
	VALUES ($1, 1, 'default', now(), 10, 'retryable', $2))
UPDATE jobs SET attempt_base = 1 WHERE id = $1`, expiredBefore.ID, batchlane.ExpiredMessage)
			require.NoError(t, err)
			b.clock.Advance(fill)
			once(t, bt) // sent
			b.clock.Advance(2 * time.Hour)
			once(t, bt) // expired

			got := b.get(t, j.ID)
			require.Equal(t, jobs.StatusRetrying, got.Status, "%+v", got.LastError)
			require.Equal(t, jobs.LaneOnline, got.Lane, "online: the batch lane could not make it")
			require.Equal(t, 0, got.Attempts, "the expired round's attempt was given back")
			require.Equal(t, "batch_expired", got.LastError.Type)
			attempts, err := b.store.Attempts(t.Context(), j.ID)
			require.NoError(t, err)
			require.Len(t, attempts, 1, "the round keeps its attempt row")

			got = b.get(t, spent.ID)
			require.Equal(t, jobs.StatusDead, got.Status, "max_attempts given back already: it counts")
			require.Equal(t, jobs.ReasonRetriesExhausted, *got.DeadReason)
			require.Equal(t, 1, got.Attempts)
			got = b.get(t, expiredBefore.ID)
			require.Equal(t, jobs.StatusDead, got.Status, "max_attempts expired rounds already: it counts")
			require.Equal(t, jobs.ReasonRetriesExhausted, *got.DeadReason)
			require.Equal(t, []string{j.ID}, b.online())
		})
	}
}
