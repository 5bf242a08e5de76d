package batchlane_test

import (
	"bytes"
	"context"
	"encoding/json"
	"mime/multipart"
	"net/http"
	"net/http/httptest"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/batchlane"
	"github.com/llmq/llmq/internal/jobs"
)

// uploadsSeen is a Client that keeps the id of each file its Submit uploads, told before the
// upload's record.
type uploadsSeen struct {
	batchlane.Client
	mu  sync.Mutex
	ids []string
}

func (u *uploadsSeen) Submit(ctx context.Context, ref string, reqs []batchlane.Request, uploaded func(string) error) (string, error) {
	return u.Client.Submit(ctx, ref, reqs, func(id string) error {
		u.mu.Lock()
		u.ids = append(u.ids, id)
		u.mu.Unlock()
		return uploaded(id)
	})
}

// seen returns the ids kept so far.
func (u *uploadsSeen) seen() []string {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]string(nil), u.ids...)
}

// onceInBackground runs bt's pass in a goroutine and returns a channel that gets its error, or
// is closed without one when the pass's goroutine ended without returning (runtime.Goexit).
func onceInBackground(bt *batchlane.Batcher) <-chan error {
	done := make(chan error, 1)
	go func() {
		defer close(done)
		done <- bt.Once(context.Background())
	}()
	return done
}

// waitFor waits for ch, at most wait.
func waitFor[T any](t *testing.T, ch <-chan T, what string) (T, bool) {
	t.Helper()
	select {
	case v, ok := <-ch:
		return v, ok
	case <-time.After(wait):
		t.Fatalf("%s: not within %s", what, wait)
	}
	var zero T
	return zero, false
}

// TestBatcher_DeletesAnUploadWhoseRecordDied: a process that dies between an upload's answer and
// its record leaves the input file at the provider with no row. The next leader lists the
// provider's batch files, records the file as the dead process would have, and deletes it once
// the send again finds no batch made of it. Before, nothing knew the file: it stayed at OpenAI.
func TestBatcher_DeletesAnUploadWhoseRecordDied(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{provider: "openai"})
	j, orphan := b.orphanUpload(t)

	b.clock.Advance(11 * time.Minute) // past the dead send's claim
	once(t, b.batcher(nil))
	id := b.get(t, j.ID).BatchID
	require.NotNil(t, id, "sent again")
	require.Empty(t, b.storedFiles(t, orphan), "the upload no row recorded is left at the provider")
	input := b.openAIFiles(t, *id)[:1]
	require.Equal(t, input, b.storedFiles(t, input), "the running batch's input file is deleted")
	require.Equal(t, float64(1), b.counter(t, "file_deletes", "deleted"))
}

// orphanUpload submits a job and makes a pass send its batch, the pass ending as its process
// would die between the upload's answer and its record: it returns the job and the upload (a
// one-element slice), which the provider holds and no row records.
func (b *testBundle) orphanUpload(t *testing.T) (*jobs.Job, []string) {
	t.Helper()
	j := b.submit(t, "x", 0, 0)
	b.clock.Advance(fill)
	client := &uploadsSeen{Client: b.client}
	dying := b.batcher(client)
	batchlane.AfterUpload(dying, runtime.Goexit)
	_, returned := waitFor(t, onceInBackground(dying), "the dying pass")
	require.False(t, returned, "the pass went on past the upload")
	orphan := client.seen()
	require.Len(t, orphan, 1)
	require.Equal(t, orphan, b.storedFiles(t, orphan))
	require.Zero(t, b.fileRows(t), "the upload was recorded")
	require.Zero(t, b.sim.BatchStats().Created)
	return j, orphan
}

// TestBatcher_LeavesAnUploadBeingRecorded: a leader that lists the provider's files while another
// process has an upload answered and not yet recorded (a leader cut off from its lock, still
// sending) records it for its batch, which that send holds: it is not deleted, and the send goes
// on to make the batch of it.
func TestBatcher_LeavesAnUploadBeingRecorded(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{provider: "openai"})
	j := b.submit(t, "x", 0, 0)
	b.clock.Advance(fill)

	client := &uploadsSeen{Client: b.client}
	slow := b.batcher(client)
	answered, release := make(chan struct{}), make(chan struct{})
	batchlane.AfterUpload(slow, func() {
		close(answered)
		<-release
	})
	done := onceInBackground(slow)
	waitFor(t, answered, "the upload")
	upload := client.seen()

	other := b.batcher(nil)
	once(t, other)
	require.Equal(t, upload, b.storedFiles(t, upload), "a file being recorded is deleted")
	require.Equal(t, 1, b.fileRows(t))

	close(release)
	err, _ := waitFor(t, done, "the slow pass")
	require.NoError(t, err)
	id := b.get(t, j.ID).BatchID
	require.NotNil(t, id)
	require.Equal(t, upload, b.openAIFiles(t, *id)[:1], "the batch reads another file")
	b.clock.Advance(time.Minute)
	once(t, other)
	require.Equal(t, upload, b.storedFiles(t, upload), "the running batch's input file is deleted")
}

// TestBatcher_LeavesUploadsOfNoBatchOfItsOwn: a file named as llmq names its uploads whose batch
// is not one of this database's (another deployment sharing the key) is neither recorded nor
// deleted.
func TestBatcher_LeavesUploadsOfNoBatchOfItsOwn(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{provider: "openai"})
	b.uploadNamed(t, "llmq-"+uuid.NewString()+".jsonl")

	once(t, b.batcher(nil))
	require.Zero(t, b.fileRows(t))
	require.Equal(t, 1, b.sim.BatchStats().Uploads)
	require.Zero(t, b.sim.BatchStats().Deletes)
}

// uploadNamed uploads a file of purpose batch named name to the simulator, as another program
// with the same key would, and returns its id.
func (b *testBundle) uploadNamed(t *testing.T, name string) string {
	t.Helper()
	var form bytes.Buffer
	mw := multipart.NewWriter(&form)
	require.NoError(t, mw.WriteField("purpose", "batch"))
	fw, err := mw.CreateFormFile("file", name)
	require.NoError(t, err)
	_, err = fw.Write([]byte("{}\n"))
	require.NoError(t, err)
	require.NoError(t, mw.Close())
	rec := httptest.NewRecorder()
	req := httptest.NewRequestWithContext(t.Context(), http.MethodPost, "/v1/files", &form)
	req.Header.Set("Content-Type", mw.FormDataContentType())
	b.sim.ServeHTTP(rec, req)
	require.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
	var file struct {
		ID string `json:"id"`
	}
	require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &file))
	return file.ID
}
