package batchlane_test

import (
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/batchlane"
)

// TestRetryFiles_TheNextPassDeletesAGivenUpFile: the files whose deletes ran out of attempts are
// listed as given up and left by the passes; RetryFiles puts them back in line, and the leader's
// next pass deletes them at the provider and forgets them.
func TestRetryFiles_TheNextPassDeletesAGivenUpFile(t *testing.T) {
	t.Parallel()
	var down atomic.Bool
	down.Store(true)
	b := setup(t, setupOpts{provider: "openai", front: func(sim http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Method == http.MethodDelete && down.Load() {
				http.Error(w, `{"error":{"message":"down","type":"server_error"}}`, http.StatusInternalServerError)
				return
			}
			sim.ServeHTTP(w, r)
		})
	}})
	_, id := sentOpenAI(t, b, "answered")
	for range batchlane.MaxFileDeleteAttempts + 1 {
		b.clock.Advance(2 * time.Hour) // past any backoff
		once(t, b.batcher(nil))
	}
	files := b.openAIFiles(t, id)
	require.Equal(t, files, b.storedFiles(t, files))
	givenUp, err := batchlane.ListFiles(t.Context(), b.pool, batchlane.FilesFilter{GivenUp: true, Credential: "default"})
	require.NoError(t, err)
	require.Len(t, givenUp, len(files))
	for _, f := range givenUp {
		require.True(t, f.GivenUp)
		require.Equal(t, batchlane.MaxFileDeleteAttempts, f.Attempts)
		require.Nil(t, f.NextTry, "a given-up file has no next try")
		require.NotNil(t, f.LastError)
		require.Contains(t, *f.LastError, "500")
	}

	down.Store(false)
	b.clock.Advance(2 * time.Hour)
	once(t, b.batcher(nil))
	require.Equal(t, len(files), b.fileRows(t), "a given-up file is tried no more")

	reset, err := batchlane.RetryFiles(t.Context(), b.pool, batchlane.RetryFilesParams{All: true, Credential: "other"})
	require.NoError(t, err)
	require.Empty(t, reset, "another credential's")
	reset, err = batchlane.RetryFiles(t.Context(), b.pool, batchlane.RetryFilesParams{All: true})
	require.NoError(t, err)
	require.Len(t, reset, len(files))
	once(t, b.batcher(nil)) // no clock advance: due at once
	require.Empty(t, b.storedFiles(t, files))
	require.Zero(t, b.fileRows(t))
}
