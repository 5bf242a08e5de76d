package batchlane_test

import (
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/batchlane"
	"github.com/llmq/llmq/internal/jobs"
)

// openAIFiles returns the input, output and error file ids of the simulator's OpenAI batch id
// (an output or error file the batch has none of is left out).
func (b *testBundle) openAIFiles(t *testing.T, id string) []string {
	t.Helper()
	rec := httptest.NewRecorder()
	req := httptest.NewRequestWithContext(t.Context(), http.MethodGet, "/v1/batches/"+id, nil)
	b.sim.ServeHTTP(rec, req)
	require.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
	var batch struct {
		InputFileID  string  `json:"input_file_id"`
		OutputFileID *string `json:"output_file_id"`
		ErrorFileID  *string `json:"error_file_id"`
	}
	require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &batch))
	files := []string{batch.InputFileID}
	for _, f := range []*string{batch.OutputFileID, batch.ErrorFileID} {
		if f != nil {
			files = append(files, *f)
		}
	}
	return files
}

// storedFiles returns which of files the simulator still holds.
func (b *testBundle) storedFiles(t *testing.T, files []string) []string {
	t.Helper()
	var out []string
	for _, f := range files {
		rec := httptest.NewRecorder()
		path := "/v1/files/" + f + "/content"
		b.sim.ServeHTTP(rec, httptest.NewRequestWithContext(t.Context(), http.MethodGet, path, nil))
		if rec.Code == http.StatusOK {
			out = append(out, f)
		}
	}
	return out
}

// TestBatcher_DeletesOpenAIFilesOnceRecorded: an OpenAI batch's input, output and error files
// are deleted at the provider once its results are recorded and the batch is closed (they
// counted against the organisation's file storage, never deleted), never before: while the
// recording fails, or after a leader died between the recording and the close, the output file
// is still there to be read. (A delete that fails: TestBatcher_RetriesAFailedDelete.)
func TestBatcher_DeletesOpenAIFilesOnceRecorded(t *testing.T) {
	t.Parallel()

	sent := func(t *testing.T, b *testBundle) (*jobs.Job, string) { return sentOpenAI(t, b, "answered") }

	t.Run("Recorded", func(t *testing.T) {
		t.Parallel()
		b := setup(t, setupOpts{provider: "openai"})
		j, id := sent(t, b)
		b.clock.Advance(2 * time.Hour)
		once(t, b.batcher(nil))
		require.Equal(t, jobs.StatusSucceeded, b.get(t, j.ID).Status)
		files := b.openAIFiles(t, id)
		require.Len(t, files, 3, "input, output and error files")
		require.Empty(t, b.storedFiles(t, files), "the batch's files are left at the provider")
		require.Equal(t, 3, b.sim.BatchStats().Deletes)
	})

	t.Run("FailedBatch", func(t *testing.T) {
		t.Parallel()
		// A batch past the enqueued token limit fails at once, without results: its input
		// file goes when it is closed.
		b := setup(t, setupOpts{provider: "openai", enqueuedTokens: 1})
		j := b.submit(t, "too many tokens", 0, 0)
		b.clock.Advance(fill)
		once(t, b.batcher(nil))
		id := *b.get(t, j.ID).BatchID
		files := b.openAIFiles(t, id)
		require.Len(t, files, 1, "the input file only")
		require.Equal(t, files, b.storedFiles(t, files))
		b.clock.Advance(time.Hour)
		once(t, b.batcher(nil))
		require.Equal(t, float64(1), b.counter(t, "batches", "refused"))
		require.Empty(t, b.storedFiles(t, files))
	})

	t.Run("KeptWhileRecordingFails", func(t *testing.T) {
		t.Parallel()
		b := setup(t, setupOpts{provider: "openai"})
		j, id := sent(t, b)
		_, err := b.pool.Exec(t.Context(), `
CREATE FUNCTION refuse_success() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF NEW.status = 'succeeded' THEN RAISE EXCEPTION 'success refused'; END IF;
  RETURN NEW;
END $$;
CREATE TRIGGER refuse_success BEFORE UPDATE OF status ON jobs
  FOR EACH ROW EXECUTE FUNCTION refuse_success()`)
		require.NoError(t, err)
		b.clock.Advance(2 * time.Hour)
		require.ErrorContains(t, b.batcher(nil).Once(t.Context()), "success refused")
		files := b.openAIFiles(t, id)
		require.Equal(t, files, b.storedFiles(t, files),
			"a file deleted before the results were recorded")
		require.Zero(t, b.sim.BatchStats().Deletes)

		// Once Postgres records them, the files go.
		_, err = b.pool.Exec(t.Context(), `DROP TRIGGER refuse_success ON jobs`)
		require.NoError(t, err)
		b.clock.Advance(time.Hour) // past the failed pass's backoff
		once(t, b.batcher(nil))
		require.Equal(t, jobs.StatusSucceeded, b.get(t, j.ID).Status)
		require.Empty(t, b.storedFiles(t, files))
	})

	t.Run("KeptUntilClosed", func(t *testing.T) {
		t.Parallel()
		b := setup(t, setupOpts{provider: "openai"})
		_, id := sent(t, b)
		b.clock.Advance(2 * time.Hour)
		died := b.batcher(nil)
		crash := errors.New("the process died")
		batchlane.CrashAfterRecord(died, crash)
		require.ErrorIs(t, died.Once(t.Context()), crash)
		files := b.openAIFiles(t, id)
		require.Equal(t, files, b.storedFiles(t, files))

		once(t, b.batcher(nil)) // the next leader closes the batch
		require.Empty(t, b.storedFiles(t, files))
	})
}
