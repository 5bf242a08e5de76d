package batchlane_test

import (
	"context"
	"log/slog"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/batchlane"
	"github.com/llmq/llmq/internal/jobs"
	"github.com/llmq/llmq/internal/logtest"
)

// TestBatcher_DeletesACanceledBatchsFiles: an OpenAI batch none of whose jobs still wait is
// canceled at the provider, and once the provider reports it ended (cancelled), the batch is
// closed canceled and its input file (and the error file of its canceled requests) deleted, as
// an ended batch's are: they were left at OpenAI. A batch the provider no longer knows (404)
// when its cancel is looked at again is closed, logged once, and only its input file, recorded
// at its upload, deleted: its other files are not known.
func TestBatcher_DeletesACanceledBatchsFiles(t *testing.T) {
	t.Parallel()

	t.Run("Deleted", func(t *testing.T) {
		t.Parallel()
		b := setup(t, setupOpts{provider: "openai"})
		bt := b.batcher(nil)
		id := b.canceledInBatch(t, bt)
		b.clock.Advance(time.Minute)
		once(t, bt) // nothing waits for the batch: canceled at the provider
		require.Equal(t, 1, b.sim.BatchStats().Cancels)
		files := b.openAIFiles(t, id)
		require.Len(t, files, 2, "input and error files")
		b.clock.Advance(10 * time.Minute)
		once(t, bt) // the provider reports it cancelled
		require.Empty(t, b.storedFiles(t, files), "the canceled batch's files are left at the provider")
		require.Equal(t, "canceled", b.batchState(t))
		require.Equal(t, float64(1), b.counter(t, "batches", "canceled"))
		require.Zero(t, b.counter(t, "batches", "ended"))
		require.Equal(t, 1, b.sim.BatchStats().Cancels, "canceled once")
	})

	t.Run("GoneAtTheProvider", func(t *testing.T) {
		t.Parallel()
		var gone atomic.Bool
		b := setup(t, setupOpts{provider: "openai", front: func(sim http.Handler) http.Handler {
			return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if gone.Load() && r.Method == http.MethodGet && strings.HasPrefix(r.URL.Path, "/v1/batches/") {
					http.Error(w, `{"error":{"message":"No batch found","type":"invalid_request_error"}}`,
						http.StatusNotFound)
					return
				}
				sim.ServeHTTP(w, r)
			})
		}})
		logs := &logtest.Buffer{}
		bt := batchlane.New(batchlane.Config{Pool: b.pool, Now: b.clock.Now, Metrics: b.metrics,
			Logger:  slog.New(slog.NewTextHandler(logs, nil)),
			Lanes:   []batchlane.Lane{{Credential: "default", Client: b.client, Config: b.cfg}},
			Enqueue: func(context.Context, string, jobs.Priority) error { return nil }})
		id := b.canceledInBatch(t, bt)
		b.clock.Advance(time.Minute)
		once(t, bt)
		require.Equal(t, 1, b.sim.BatchStats().Cancels)
		files := b.openAIFiles(t, id)
		gone.Store(true)
		b.clock.Advance(10 * time.Minute)
		once(t, bt)
		require.Equal(t, "canceled", b.batchState(t))
		require.Equal(t, files[1:], b.storedFiles(t, files),
			"the input file is deleted (recorded at its upload); the error file is not known")
		require.Equal(t, 1, b.sim.BatchStats().Deletes)
		require.Equal(t, 1, lines(logs, "WARN", "a canceled batch is unknown to the provider"))
		b.clock.Advance(time.Hour)
		once(t, bt)
		require.Equal(t, 1, lines(logs, "WARN", "a canceled batch is unknown to the provider"), "logged once")
		require.Equal(t, float64(1), b.counter(t, "batches", "canceled"))
	})
}

// canceledInBatch sends a batch of one job with bt, cancels the job and returns the provider's
// batch id.
func (b *testBundle) canceledInBatch(t *testing.T, bt *batchlane.Batcher) string {
	t.Helper()
	j := b.submit(t, "x", 0, 0)
	b.clock.Advance(fill)
	once(t, bt)
	id := *b.get(t, j.ID).BatchID
	_, err := b.store.Cancel(t.Context(), j.ID)
	require.NoError(t, err)
	return id
}

// batchState returns the state of the one batch row.
func (b *testBundle) batchState(t *testing.T) string {
	t.Helper()
	var s string
	require.NoError(t, b.pool.QueryRow(t.Context(), `SELECT state FROM provider_batches`).Scan(&s))
	return s
}
