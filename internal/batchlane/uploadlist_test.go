package batchlane_test

import (
	"context"
	"log/slog"
	"net/http"
	"net/url"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/batchlane"
	"github.com/llmq/llmq/internal/logtest"
)

// listFront stands before the simulator: it counts the file lists (GET /v1/files) in lists and
// hands each on with its query changed by edit, or answers it 404 when edit is nil (an
// OpenAI-compatible endpoint that lists no files).
func listFront(lists *atomic.Int64, edit func(url.Values)) func(http.Handler) http.Handler {
	return func(sim http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Method != http.MethodGet || r.URL.Path != "/v1/files" {
				sim.ServeHTTP(w, r)
				return
			}
			lists.Add(1)
			if edit == nil {
				http.Error(w, `{"error":{"message":"Not Found","type":"invalid_request_error"}}`, http.StatusNotFound)
				return
			}
			q := r.URL.Query()
			edit(q)
			r.URL.RawQuery = q.Encode()
			sim.ServeHTTP(w, r)
		})
	}
}

// TestBatcher_ListsUploadsPastTheFirstPage: the listing reads the pages after the first (after
// the last file of each) until has_more says none is left: an upload no row records that a page
// of newer files holds back is found and deleted all the same.
func TestBatcher_ListsUploadsPastTheFirstPage(t *testing.T) {
	t.Parallel()
	var lists atomic.Int64
	b := setup(t, setupOpts{provider: "openai", front: listFront(&lists, func(q url.Values) { q.Set("limit", "1") })})
	j, orphan := b.orphanUpload(t)
	b.uploadNamed(t, "report.jsonl") // newer: the first page

	b.clock.Advance(11 * time.Minute) // past the dead send's claim
	before := lists.Load()
	once(t, b.batcher(nil))
	require.Equal(t, int64(2), lists.Load()-before, "a page a file, two files")
	require.NotNil(t, b.get(t, j.ID).BatchID, "sent again")
	require.Empty(t, b.storedFiles(t, orphan), "the upload on the second page is left at the provider")
}

// TestBatcher_StopsAListThatDoesNotMoveOn: an endpoint that drops after (a proxy answering
// the same page, has_more true, however far it is asked to go) is read twice, not for every
// page the listing may read, and what that page holds is still recorded.
func TestBatcher_StopsAListThatDoesNotMoveOn(t *testing.T) {
	t.Parallel()
	var lists atomic.Int64
	b := setup(t, setupOpts{provider: "openai", front: listFront(&lists, func(q url.Values) {
		q.Set("limit", "1")
		q.Del("after")
	})})
	b.uploadNamed(t, "report.jsonl")
	j, orphan := b.orphanUpload(t) // the newest file: the page every list answers

	b.clock.Advance(11 * time.Minute)
	before := lists.Load()
	once(t, b.batcher(nil))
	require.Equal(t, int64(2), lists.Load()-before, "the page answered again ends the list")
	require.NotNil(t, b.get(t, j.ID).BatchID)
	require.Empty(t, b.storedFiles(t, orphan), "the upload on the page is left at the provider")
}

// TestBatcher_SendsWhenTheProviderListsNoFiles: an OpenAI-compatible endpoint that lists no
// files (404) fails no pass: the batch is sent, a warning logged, and the list is not asked for
// again (nor the warning logged) before an hour has passed.
func TestBatcher_SendsWhenTheProviderListsNoFiles(t *testing.T) {
	t.Parallel()
	var lists atomic.Int64
	b := setup(t, setupOpts{provider: "openai", front: listFront(&lists, nil)})
	logs := &logtest.Buffer{}
	bt := batchlane.New(batchlane.Config{Pool: b.pool, Now: b.clock.Now, Metrics: b.metrics, Enqueue: b.enqueue,
		Logger: slog.New(slog.NewTextHandler(logs, nil)),
		Lanes:  []batchlane.Lane{{Credential: "default", Client: b.client, Config: b.cfg}}})
	j := b.submit(t, "x", 0, 0)
	b.clock.Advance(fill)

	once(t, bt)
	require.NotNil(t, b.get(t, j.ID).BatchID, "sent")
	require.Equal(t, int64(1), lists.Load())
	require.Equal(t, 1, lines(logs, "WARN", "could not list the batch input files"))

	b.clock.Advance(59 * time.Minute)
	once(t, bt)
	require.Equal(t, int64(1), lists.Load(), "listed again within the hour")
	b.clock.Advance(time.Minute)
	once(t, bt)
	require.Equal(t, int64(2), lists.Load(), "not listed again after the hour")
	require.Equal(t, 2, lines(logs, "WARN", "could not list the batch input files"))
}

// TestBatcher_AdoptsUploadsOfItsOwnCredentialOnly: two credentials on one key list the same
// files; an upload of a batch of one of them is recorded under that one only, not again under
// the other.
func TestBatcher_AdoptsUploadsOfItsOwnCredentialOnly(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{provider: "openai"})
	j := b.submit(t, "x", 0, 0)
	b.clock.Advance(fill)
	once(t, b.batcher(nil))
	require.NotNil(t, b.get(t, j.ID).BatchID)
	require.Equal(t, 1, b.fileRows(t), "the input file")

	both := batchlane.New(batchlane.Config{Pool: b.pool, Now: b.clock.Now, Metrics: b.metrics, Enqueue: b.enqueue,
		Lanes: []batchlane.Lane{{Credential: "default", Client: b.client, Config: b.cfg},
			{Credential: "spare", Client: b.client, Config: b.cfg}}})
	once(t, both)
	require.Equal(t, 1, b.fileRows(t), "recorded again under the other credential")
}

// TestBatcher_ListsPastNamesThatCarryNoBatchID: a file whose name has llmq's form but no batch id
// in it (another program's) is passed over, and the uploads that do carry one are recorded.
func TestBatcher_ListsPastNamesThatCarryNoBatchID(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{provider: "openai"})
	j, orphan := b.orphanUpload(t)
	for _, name := range []string{"llmq-nightly.jsonl", "llmq-.jsonl"} {
		b.uploadNamed(t, name)
	}

	b.clock.Advance(11 * time.Minute)
	once(t, b.batcher(nil))
	require.NotNil(t, b.get(t, j.ID).BatchID)
	require.Empty(t, b.storedFiles(t, orphan))
}

// TestBatcher_ListsAgainAfterAListCutShort: a pass whose context ends during the listing (the
// lead lost, the worker stopping) leaves the credential to be listed by the next pass, not an
// hour on.
func TestBatcher_ListsAgainAfterAListCutShort(t *testing.T) {
	t.Parallel()
	var lists atomic.Int64
	reached := make(chan struct{}, 1)
	b := setup(t, setupOpts{provider: "openai", front: func(sim http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Method == http.MethodGet && r.URL.Path == "/v1/files" && lists.Add(1) == 1 {
				reached <- struct{}{}
				select { // held until the pass gives up on it
				case <-r.Context().Done():
				case <-time.After(wait):
				}
				return
			}
			sim.ServeHTTP(w, r)
		})
	}})
	bt := b.batcher(nil)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- bt.Once(ctx) }()
	waitFor(t, reached, "the list")
	cancel()
	waitFor(t, done, "the cut pass")

	once(t, bt)
	require.Equal(t, int64(2), lists.Load(), "the cut list is not asked for again")
}

// TestBatcher_ListingsShareThePassesTime: a provider whose file list hangs holds a pass back for
// the pass's time for listings, not that time for each credential: the credentials the pass
// did not reach are listed by the next one, and each once.
func TestBatcher_ListingsShareThePassesTime(t *testing.T) {
	t.Parallel()
	var lists atomic.Int64
	b := setup(t, setupOpts{provider: "openai", front: func(sim http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Method == http.MethodGet && r.URL.Path == "/v1/files" {
				lists.Add(1)
				select { // held until the pass gives up on it
				case <-r.Context().Done():
				case <-time.After(wait):
				}
				return
			}
			sim.ServeHTTP(w, r)
		})
	}})
	bt := batchlane.New(batchlane.Config{Pool: b.pool, Now: b.clock.Now, Metrics: b.metrics, Enqueue: b.enqueue,
		Lanes: []batchlane.Lane{{Credential: "default", Client: b.client, Config: b.cfg},
			{Credential: "spare", Client: b.client, Config: b.cfg}}})
	batchlane.SetSweepTimeout(bt, 100*time.Millisecond)
	_ = bt.Once(t.Context()) // the cut list is a warning, not the pass's error
	require.Equal(t, int64(1), lists.Load(), "the second credential listed after the pass's time")
	_ = bt.Once(t.Context())
	require.Equal(t, int64(2), lists.Load(), "the second credential not listed by the next pass")
	_ = bt.Once(t.Context())
	require.Equal(t, int64(2), lists.Load(), "a credential listed again within the hour")
}

// TestBatcher_ListsAtEachLeadsFirstPass: a process that takes the lead again within the hour of
// its last listing lists the uploads at its lead's first pass: another process led meanwhile,
// and its own record of the listing says nothing of what happened since.
func TestBatcher_ListsAtEachLeadsFirstPass(t *testing.T) {
	t.Parallel()
	var lists atomic.Int64
	b := setup(t, setupOpts{provider: "openai", front: listFront(&lists, func(url.Values) {})})
	bt := b.batcher(nil)
	once(t, bt)
	require.Equal(t, int64(1), lists.Load())

	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- batchlane.Lead(ctx, bt) }()
	require.Eventually(t, func() bool { return lists.Load() == 2 }, wait, 10*time.Millisecond,
		"the lead's first pass did not list the uploads")
	cancel()
	waitFor(t, done, "the lead's end")
}
