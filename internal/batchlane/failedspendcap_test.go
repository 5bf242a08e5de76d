package batchlane_test

import (
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"regexp"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/alert"
	"github.com/llmq/llmq/internal/batchlane"
	"github.com/llmq/llmq/internal/jobs"
	"github.com/llmq/llmq/internal/logtest"
)

// failedBatchFront answers the retrieve of every OpenAI batch as failed as a whole with code
// (its errors' first entry, for no line: the batch, not one of its requests), as OpenAI fails a
// batch whose organisation cannot pay.
func failedBatchFront(code string) func(sim http.Handler) http.Handler {
	retrieve := regexp.MustCompile(`^/v1/batches/[^/]+$`)
	return func(sim http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Method != http.MethodGet || !retrieve.MatchString(r.URL.Path) {
				sim.ServeHTTP(w, r)
				return
			}
			rec := httptest.NewRecorder()
			sim.ServeHTTP(rec, r)
			var batch map[string]any
			if rec.Code != http.StatusOK || json.Unmarshal(rec.Body.Bytes(), &batch) != nil {
				w.WriteHeader(rec.Code)
				_, _ = w.Write(rec.Body.Bytes())
				return
			}
			batch["status"], batch["output_file_id"], batch["error_file_id"] = "failed", nil, nil
			batch["errors"] = map[string]any{"object": "list", "data": []any{map[string]any{"code": code,
				"message": "You exceeded your current quota, please check your plan and billing details.", "line": nil}}}
			w.Header().Set("content-type", "application/json")
			_ = json.NewEncoder(w).Encode(batch)
		})
	}
}

// TestBatcher_FailedBatchWithASpendCapPausesTheCredential: an OpenAI batch that failed as a
// whole with a spend-cap code (insufficient_quota) is the spend cap the online lane reads in a
// 429 without Retry-After: the credential is paused (in Postgres too) and the alert raised, once,
// and its jobs are dead-lettered (rate_limited_no_retry_after, for an operator to retry once the
// account pays again) without an attempt counted (none of its requests ran), not sent online to
// a key that cannot pay. A failed batch with another code still sends its jobs online.
func TestBatcher_FailedBatchWithASpendCapPausesTheCredential(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := setup(t, setupOpts{provider: "openai", front: failedBatchFront("insufficient_quota")})
	p := b.pausable(t)
	logs := &logtest.Buffer{}
	var dead []string
	bt := batchlane.New(batchlane.Config{Pool: b.pool, Now: b.clock.Now, Metrics: b.metrics, Pauses: p.pauses,
		Alerter:      alert.New(alert.Config{Logger: slog.New(slog.NewTextHandler(logs, nil)), Now: b.clock.Now}),
		DeadLettered: func(_, reason string) { dead = append(dead, reason) },
		Lanes:        []batchlane.Lane{{Credential: "default", Client: b.client, Config: b.cfg, Gate: p.gate}},
		Enqueue:      b.enqueue})
	one, two := b.submit(t, "one", 0, 0), b.submit(t, "two", 0, 0)
	b.clock.Advance(fill)
	once(t, bt)
	b.clock.Advance(time.Minute) // the batch's first poll: failed
	_ = bt.Once(ctx)

	ps, err := p.gate.Paused(ctx)
	require.NoError(t, err)
	require.True(t, ps.Paused, "a failed batch's spend cap pauses the credential")
	kept, err := p.pauses.Get(ctx, p.gate)
	require.NoError(t, err)
	require.True(t, kept.Paused, "kept in Postgres")
	require.Equal(t, "rate_limited_no_retry_after", kept.Reason)
	require.Equal(t, 1, logs.Count("credential paused until an operator resumes it"), "the pause's alert, once")
	for _, id := range []string{one.ID, two.ID} {
		got := b.get(t, id)
		require.Equal(t, jobs.StatusDead, got.Status, "%+v", got.LastError)
		require.Equal(t, "rate_limited_no_retry_after", *got.DeadReason)
		require.Equal(t, "spend_cap", got.LastError.Class)
		require.Equal(t, "insufficient_quota", got.LastError.Type)
		require.Zero(t, got.Attempts, "no request of the batch ran")
	}
	require.Equal(t, []string{"rate_limited_no_retry_after", "rate_limited_no_retry_after"}, dead)
	require.Empty(t, b.online(), "a dead job is not enqueued")
	require.Equal(t, float64(1), b.counter(t, "batches", "refused"))

	later := b.submit(t, "later", 0, 0)
	b.clock.Advance(fill)
	once(t, bt)
	require.Equal(t, 1, b.sim.BatchStats().Created, "a paused credential sends no batch")
	require.Empty(t, b.batchRefs(t)[later.ID])
}
