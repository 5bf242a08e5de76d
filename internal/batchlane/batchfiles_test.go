package batchlane_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/batchlane"
	"github.com/llmq/llmq/internal/jobs"
	"github.com/llmq/llmq/internal/logtest"
)

// sentOpenAI stores an answered job and one that expires (the error file's), sends their batch
// with a batcher of the bundle and returns the answered job and the provider's batch id.
func sentOpenAI(t *testing.T, b *testBundle, text string) (*jobs.Job, string) {
	t.Helper()
	ok := b.submit(t, text, 0, 0)
	b.submit(t, "llmsim-batch-expire", 0, 0)
	b.clock.Advance(fill)
	once(t, b.batcher(nil))
	got := b.get(t, ok.ID)
	require.NotNil(t, got.BatchID)
	return got, *got.BatchID
}

// fileRows returns the rows of provider_batch_files.
func (b *testBundle) fileRows(t *testing.T) int {
	t.Helper()
	var n int
	require.NoError(t, b.pool.QueryRow(t.Context(), `SELECT count(*) FROM provider_batch_files`).Scan(&n))
	return n
}

// TestBatcher_DeletesTheInputFileOfALostBatch: a batch whose poll the provider answers 404 (it no
// longer knows it) is closed, its jobs sent round again; its input file, which llmq uploaded and
// the provider may still hold, is deleted all the same (recorded at its upload). Before, the lost
// batch's files were not known and stayed at the provider.
func TestBatcher_DeletesTheInputFileOfALostBatch(t *testing.T) {
	t.Parallel()
	var gone atomic.Bool
	b := setup(t, setupOpts{provider: "openai", front: func(sim http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if gone.Load() && r.Method == http.MethodGet && strings.HasPrefix(r.URL.Path, "/v1/batches/") {
				http.Error(w, `{"error":{"message":"No batch found","type":"invalid_request_error"}}`, http.StatusNotFound)
				return
			}
			sim.ServeHTTP(w, r)
		})
	}})
	j := b.submit(t, "x", 0, 0)
	b.clock.Advance(fill)
	once(t, b.batcher(nil))
	id := *b.get(t, j.ID).BatchID
	input := b.openAIFiles(t, id)[:1]
	require.Equal(t, input, b.storedFiles(t, input))

	gone.Store(true)
	b.clock.Advance(time.Minute)
	once(t, b.batcher(nil))
	require.Equal(t, float64(1), b.counter(t, "batches", "lost"))
	require.Empty(t, b.storedFiles(t, input), "the lost batch's input file is left at the provider")
	require.Equal(t, float64(1), b.counter(t, "file_deletes", "deleted"))
}

// closedWithFilesLeft sends an OpenAI batch (see sentOpenAI) and has a leader close it and die
// before the deletes of its files; it returns the answered job and the provider's batch id.
func closedWithFilesLeft(t *testing.T, b *testBundle) (*jobs.Job, string) {
	t.Helper()
	j, id := sentOpenAI(t, b, "answered")
	b.clock.Advance(2 * time.Hour)
	died := b.batcher(nil)
	crash := errors.New("the process died")
	batchlane.CrashAfterClose(died, crash)
	require.ErrorIs(t, died.Once(t.Context()), crash)
	return j, id
}

// TestBatcher_DeletesFilesAfterADeathAfterTheClose: a leader that dies between a batch's close
// (committed) and the deletes of its files leaves them recorded, and the next leader deletes
// them. Before, the deletes were made once, by the pass that closed the batch, and a death
// before them left the files at the provider.
func TestBatcher_DeletesFilesAfterADeathAfterTheClose(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{provider: "openai"})
	j, id := closedWithFilesLeft(t, b)
	require.Equal(t, jobs.StatusSucceeded, b.get(t, j.ID).Status)
	require.Equal(t, "ended", b.batchState(t))
	files := b.openAIFiles(t, id)
	require.Len(t, files, 3)
	require.Equal(t, files, b.storedFiles(t, files), "deleted before the crash")

	once(t, b.batcher(nil)) // the next leader
	require.Empty(t, b.storedFiles(t, files), "the closed batch's files are left at the provider")
	require.Zero(t, b.fileRows(t), "a deleted file's row is removed")
}

// TestBatcher_RetriesAFailedDelete: a delete the provider fails (a 5xx) is tried again after a
// backoff, not on every pass, until it succeeds; one that keeps failing is tried
// MaxFileDeleteAttempts times, then logged once and left, its row kept for the operator. A
// failed delete fails no pass. Before, a failed delete was logged and never tried again.
func TestBatcher_RetriesAFailedDelete(t *testing.T) {
	t.Parallel()

	t.Run("UntilItSucceeds", func(t *testing.T) {
		t.Parallel()
		var down atomic.Bool
		var deletes atomic.Int64
		down.Store(true)
		b := setup(t, setupOpts{provider: "openai", front: func(sim http.Handler) http.Handler {
			return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.Method == http.MethodDelete {
					deletes.Add(1)
					if down.Load() {
						http.Error(w, `{"error":{"message":"down","type":"server_error"}}`, http.StatusInternalServerError)
						return
					}
				}
				sim.ServeHTTP(w, r)
			})
		}})
		j, id := sentOpenAI(t, b, "answered")
		b.clock.Advance(2 * time.Hour)
		once(t, b.batcher(nil))
		require.Equal(t, jobs.StatusSucceeded, b.get(t, j.ID).Status)
		require.Equal(t, float64(1), b.counter(t, "batches", "ended"), "the batch is closed all the same")
		files := b.openAIFiles(t, id)
		require.Equal(t, files, b.storedFiles(t, files))
		tried := deletes.Load()
		require.Equal(t, int64(3), tried)

		b.clock.Advance(30 * time.Second)
		once(t, b.batcher(nil))
		require.Equal(t, tried, deletes.Load(), "tried again before the backoff")

		down.Store(false)
		b.clock.Advance(time.Minute)
		once(t, b.batcher(nil))
		require.Empty(t, b.storedFiles(t, files), "a failed delete is not tried again")
		require.Zero(t, b.fileRows(t))
		require.Equal(t, float64(3), b.counter(t, "file_deletes", "failed"))
		require.Equal(t, float64(3), b.counter(t, "file_deletes", "deleted"))
	})

	t.Run("GivesUp", func(t *testing.T) {
		t.Parallel()
		// The simulator fails every delete of a file holding its marker: the input file, and
		// the output file (the answer quotes the prompt).
		b := setup(t, setupOpts{provider: "openai"})
		j := b.submit(t, "llmsim-batch-delete-error", 0, 0)
		b.clock.Advance(fill)
		logs := &logtest.Buffer{}
		bt := batchlane.New(batchlane.Config{Pool: b.pool, Now: b.clock.Now, Metrics: b.metrics,
			Logger:  slog.New(slog.NewTextHandler(logs, nil)),
			Lanes:   []batchlane.Lane{{Credential: "default", Client: b.client, Config: b.cfg}},
			Enqueue: func(context.Context, string, jobs.Priority) error { return nil }})
		once(t, bt)
		id := *b.get(t, j.ID).BatchID
		b.clock.Advance(2 * time.Hour)
		for range batchlane.MaxFileDeleteAttempts + 3 {
			once(t, bt)
			b.clock.Advance(2 * time.Hour) // past any backoff
		}
		require.Equal(t, jobs.StatusSucceeded, b.get(t, j.ID).Status)
		files := b.openAIFiles(t, id)
		stuck := b.storedFiles(t, files)
		require.NotEmpty(t, stuck)
		require.Equal(t, len(stuck), lines(logs, "WARN", "a batch file could not be deleted at the provider"),
			"logged once a file")
		require.Equal(t, float64(len(stuck)), b.counter(t, "file_deletes", "gave_up"))
		require.Equal(t, float64(len(stuck)*(batchlane.MaxFileDeleteAttempts-1)), b.counter(t, "file_deletes", "failed"))
		var attempts int
		var lastError string
		require.NoError(t, b.pool.QueryRow(t.Context(), `SELECT min(attempts), min(last_error) FROM provider_batch_files`).
			Scan(&attempts, &lastError))
		require.Equal(t, batchlane.MaxFileDeleteAttempts, attempts)
		require.Contains(t, lastError, "500")
		require.Equal(t, len(stuck), b.fileRows(t), "the rows are kept for the operator")
		// A given-up row is out of the pass's range on next_try_at's index (next_try_at <= now),
		// so that the passes' scans do not read it again and again.
		var outOfRange int
		require.NoError(t, b.pool.QueryRow(t.Context(), `SELECT count(*) FROM provider_batch_files
WHERE next_try_at = 'infinity'`).Scan(&outOfRange))
		require.Equal(t, len(stuck), outOfRange, "a given-up row the passes' index scan reads")
		// Listed given up, with no next try (infinity is no time to show), and back in range,
		// due at once, once retried.
		listed, err := batchlane.ListFiles(t.Context(), b.pool, batchlane.FilesFilter{GivenUp: true})
		require.NoError(t, err)
		require.Len(t, listed, len(stuck))
		for _, f := range listed {
			require.True(t, f.GivenUp)
			require.Nil(t, f.NextTry)
		}
		retried, err := batchlane.RetryFiles(t.Context(), b.pool, batchlane.RetryFilesParams{All: true})
		require.NoError(t, err)
		require.Len(t, retried, len(stuck))
		require.NoError(t, b.pool.QueryRow(t.Context(), `SELECT count(*) FROM provider_batch_files
WHERE next_try_at = '-infinity' AND attempts = 0`).Scan(&outOfRange))
		require.Equal(t, len(stuck), outOfRange, "a retried row is not due at once")
	})
}

// TestBatcher_DeletesAnUploadWhoseBatchWasNotCreated: an input file uploaded for a send whose
// create failed (a 5xx: the batch may exist, so the file is kept) is deleted once the send again
// has looked the batch up, found none and sent it anew: no batch reads it. The new send's file is
// kept while its batch runs. Before, every such upload stayed at the provider.
func TestBatcher_DeletesAnUploadWhoseBatchWasNotCreated(t *testing.T) {
	t.Parallel()
	var failed atomic.Bool
	var mu sync.Mutex
	var orphan string
	b := setup(t, setupOpts{provider: "openai", front: func(sim http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Method == http.MethodPost && r.URL.Path == "/v1/batches" && failed.CompareAndSwap(false, true) {
				var body struct {
					InputFileID string `json:"input_file_id"`
				}
				data, _ := io.ReadAll(r.Body)
				_ = json.Unmarshal(data, &body)
				mu.Lock()
				orphan = body.InputFileID
				mu.Unlock()
				http.Error(w, `{"error":{"message":"down","type":"server_error"}}`, http.StatusInternalServerError)
				return
			}
			sim.ServeHTTP(w, r)
		})
	}})
	j := b.submit(t, "x", 0, 0)
	b.clock.Advance(fill)
	require.Error(t, b.batcher(nil).Once(t.Context()))
	mu.Lock()
	first := []string{orphan}
	mu.Unlock()
	require.NotEmpty(t, first[0])
	require.Equal(t, first, b.storedFiles(t, first))

	b.clock.Advance(time.Hour) // past the failed send's backoff
	once(t, b.batcher(nil))
	id := b.get(t, j.ID).BatchID
	require.NotNil(t, id, "sent again")
	require.Equal(t, 2, b.sim.BatchStats().Uploads)
	require.Empty(t, b.storedFiles(t, first), "the upload no batch reads is left at the provider")
	input := b.openAIFiles(t, *id)[:1]
	require.Equal(t, input, b.storedFiles(t, input), "the running batch's input file is deleted")
}

// TestBatcher_BoundsTheDeletesOfAPass: a backlog of files due (here of a batch whose row
// retention deleted, which the provider no longer has: 404, a delete) is deleted
// FileDeletesPerPass a pass, the rest by the passes after, so that one pass does not hold the
// lead for the whole backlog.
func TestBatcher_BoundsTheDeletesOfAPass(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{provider: "openai"})
	_, err := b.pool.Exec(t.Context(), `INSERT INTO provider_batch_files (credential, file_id, batch, kind, next_try_at)
SELECT 'default', 'file-gone-' || i, gen_random_uuid(), 'ended', $2 FROM generate_series(1, $1) AS i`,
		batchlane.FileDeletesPerPass+1, b.clock.Now())
	require.NoError(t, err)
	once(t, b.batcher(nil))
	require.Equal(t, 1, b.fileRows(t), "one pass deleted more than its bound")
	require.Equal(t, float64(batchlane.FileDeletesPerPass), b.counter(t, "file_deletes", "deleted"))
	once(t, b.batcher(nil))
	require.Zero(t, b.fileRows(t))
}

// overlapping is a Client whose first DeleteFiles runs another leader's whole pass first, as a
// pass that overlaps this one (the lead lost and taken while it runs) would: both found the same
// files due.
type overlapping struct {
	batchlane.Client
	other func() error
	ran   atomic.Bool
	err   error
}

func (o *overlapping) DeleteFiles(ctx context.Context, files []string) error {
	if o.ran.CompareAndSwap(false, true) {
		o.err = o.other()
	}
	return o.Client.DeleteFiles(ctx, files)
}

// TestBatcher_CountsADeleteOncePassesOverlap: two leaders' passes that overlap both find a closed
// batch's files due and both delete them (the later deletes answered 404, a delete); a file is
// counted deleted by the pass whose statement removed its row only. Before, both counted it.
func TestBatcher_CountsADeleteOncePassesOverlap(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{provider: "openai"})
	_, id := closedWithFilesLeft(t, b)
	files := b.openAIFiles(t, id)
	require.Len(t, files, 3)

	client := &overlapping{Client: b.client, other: func() error { return b.batcher(nil).Once(t.Context()) }}
	once(t, b.batcher(client))
	require.NoError(t, client.err)
	require.Empty(t, b.storedFiles(t, files))
	require.Zero(t, b.fileRows(t))
	require.Equal(t, float64(len(files)), b.counter(t, "file_deletes", "deleted"), "a file counted by both passes")
}

// forgottenMidDelete is a Client whose DeleteFiles has an operator forget the files (ctl batch files
// forget) while their delete is under way, and then fails.
type forgottenMidDelete struct {
	batchlane.Client
	pool *pgxpool.Pool
}

func (f forgottenMidDelete) DeleteFiles(ctx context.Context, files []string) error {
	if _, err := batchlane.ForgetFiles(ctx, f.pool, "", files); err != nil {
		return err
	}
	return errors.New("the provider failed the delete")
}

// TestBatcher_AForgottenFilesFailedDeleteIsNotCounted: a file an operator forgets while the
// pass's delete of it is under way has no row for the failure to record: the failure is neither
// counted (failed, gave_up) nor logged as a file left with its row kept, and no row comes back.
func TestBatcher_AForgottenFilesFailedDeleteIsNotCounted(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{provider: "openai"})
	closedWithFilesLeft(t, b)
	require.Positive(t, b.fileRows(t))
	bt := b.batcher(forgottenMidDelete{Client: b.client, pool: b.pool})
	require.NoError(t, bt.Once(t.Context()))
	require.Zero(t, b.fileRows(t))
	require.Zero(t, b.counter(t, "file_deletes", "failed"), "a failure of a forgotten file counted")
}
