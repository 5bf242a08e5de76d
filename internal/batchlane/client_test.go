package batchlane_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/batchlane"
	"github.com/llmq/llmq/internal/clocktest"
	"github.com/llmq/llmq/internal/llmsim"
)

// simClient is a batch client of provider on a simulator of its own, whose clock is returned.
func simClient(t *testing.T, provider string) (batchlane.Client, *llmsim.Server, *clocktest.Clock) {
	t.Helper()
	clock := clocktest.New(time.Now())
	sim := llmsim.New(llmsim.Config{Now: clock.Now, Batch: llmsim.BatchConfig{ProcessingDelay: time.Hour}})
	ts := httptest.NewServer(sim)
	t.Cleanup(ts.Close)
	client, err := batchlane.NewClient(provider, ts.URL, "sk-test", ts.Client())
	require.NoError(t, err)
	return client, sim, clock
}

// simBody is a request body provider's simulator answers.
var simBody = map[string][]byte{
	"openai":    []byte(`{"model":"gpt-sim","messages":[{"role":"user","content":"hi"}]}`),
	"anthropic": []byte(`{"model":"claude-sim","max_tokens":64,"messages":[{"role":"user","content":"hi"}]}`),
}

// submitN creates n batches of size requests each through client (of provider), tagged
// prefix-0, prefix-1, ...; it returns the last one's id.
func submitN(ctx context.Context, t *testing.T, client batchlane.Client, provider, prefix string, n, size int) string {
	t.Helper()
	id := ""
	for i := range n {
		ref := fmt.Sprintf("%s-%d", prefix, i)
		reqs := make([]batchlane.Request, size)
		for k := range reqs {
			reqs[k] = batchlane.Request{CustomID: fmt.Sprintf("%s-%d", ref, k), Body: simBody[provider]}
		}
		var err error
		id, err = client.Submit(ctx, ref, reqs, noRecord)
		require.NoError(t, err)
	}
	return id
}

// TestClient_FindReadsPastTheFirstPage: the look-up of a send whose answer was lost reads the
// batch list page after page (100 a page, newest first) back to the send's start: a key that
// made more than 100 batches since pushed the lost one off the first page, and the look-up,
// finding nothing, had it sent again (paid twice). It reads no further than a batch created
// before the send began (less a minute of clock skew). OpenAI's batch is known by its metadata,
// Anthropic's by its size (here 2, the others 1).
func TestClient_FindReadsPastTheFirstPage(t *testing.T) {
	t.Parallel()
	for _, provider := range []string{"openai", "anthropic"} {
		t.Run(provider, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			client, sim, clock := simClient(t, provider)
			submitN(ctx, t, client, provider, "old", 250, 1)
			clock.Advance(time.Hour)
			since := clock.Now()
			lost := submitN(ctx, t, client, provider, "lost", 1, 2)
			submitN(ctx, t, client, provider, "new", 150, 1)
			none := func(string) bool { return false }

			pages := sim.BatchStats().Polls
			got, err := client.Find(ctx, "lost-0", since, 2, none)
			require.NoError(t, err)
			require.Equal(t, lost, got, "the lost send is on the second page")
			require.Equal(t, 2, sim.BatchStats().Polls-pages)

			pages = sim.BatchStats().Polls
			got, err = client.Find(ctx, "never-sent", since, 3, none)
			require.NoError(t, err)
			require.Empty(t, got)
			require.Equal(t, 2, sim.BatchStats().Polls-pages, "no page past the first batch older than the send")
		})
	}
}

// TestClient_RefusedBatchLeavesNoInputFile: an OpenAI batch whose creation the provider
// refuses (here a spend cap) leaves no input file behind it: each send, tried again after every
// backoff, uploaded one more that no batch would ever read. A create that failed with the
// provider's own error (a 5xx, which may have made the batch) keeps its file.
func TestClient_RefusedBatchLeavesNoInputFile(t *testing.T) {
	t.Parallel()
	for status, deletes := range map[int]int{http.StatusTooManyRequests: 1, http.StatusBadRequest: 1, http.StatusInternalServerError: 0} {
		t.Run(http.StatusText(status), func(t *testing.T) {
			t.Parallel()
			sim := llmsim.New(llmsim.Config{})
			front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.Method == http.MethodPost && r.URL.Path == "/v1/batches" {
					w.Header().Set("content-type", "application/json")
					w.WriteHeader(status)
					_, _ = io.WriteString(w, `{"error":{"message":"You exceeded your current quota","type":"insufficient_quota","param":null,"code":"insufficient_quota"}}`)
					return
				}
				sim.ServeHTTP(w, r)
			}))
			t.Cleanup(front.Close)
			client, err := batchlane.NewClient("openai", front.URL, "sk-test", front.Client())
			require.NoError(t, err)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			_, err = client.Submit(ctx, "ref", []batchlane.Request{{CustomID: "a", Body: []byte(`{"model":"gpt-sim","messages":[]}`)}},
				noRecord)
			var se *batchlane.StatusError
			require.ErrorAs(t, err, &se)
			require.Equal(t, status, se.Status, "the create's answer, not the delete's")
			st := sim.BatchStats()
			require.Equal(t, 1, st.Uploads)
			require.Equal(t, deletes, st.Deletes)
		})
	}
}

// TestClient_ErrorAnswerReadIsBounded: an error answer is read no further than its reason is
// (64 KiB, as the online lane reads one): the client read up to 1 GiB of it, and an answer that
// never ended (a broken proxy's) held the call until its timeout, with no status to classify.
func TestClient_ErrorAnswerReadIsBounded(t *testing.T) {
	t.Parallel()
	done := make(chan struct{})
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("content-type", "application/json")
		w.WriteHeader(http.StatusBadGateway)
		_, _ = io.WriteString(w, `{"error":{"type":"server_error","message":"`)
		chunk := strings.Repeat("x", 16<<10)
		for range 8 { // 128 KiB, then nothing more, and no end
			_, _ = io.WriteString(w, chunk)
		}
		w.(http.Flusher).Flush()
		select {
		case <-r.Context().Done():
		case <-done:
		}
	}))
	t.Cleanup(ts.Close)
	t.Cleanup(func() { close(done) }) // runs first: the handler returns before the server closes
	for _, provider := range []string{"anthropic", "openai"} {
		client, err := batchlane.NewClient(provider, ts.URL, "sk-test", ts.Client())
		require.NoError(t, err)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		_, err = client.Poll(ctx, "batch_1")
		cancel()
		var se *batchlane.StatusError
		require.ErrorAs(t, err, &se, provider)
		require.Equal(t, http.StatusBadGateway, se.Status, provider)
		require.LessOrEqual(t, len(se.Body), 512+len("…"), provider)
	}
}

// TestClient_FindFailsPastItsPageBound: a list that goes on past 100 pages of batches all made
// since the send began (or a proxy that ignores the cursor and answers the first page again)
// ends the look-up with an error after 100 list calls, never with "none", which would send
// the batch again and pay for it twice.
func TestClient_FindFailsPastItsPageBound(t *testing.T) {
	t.Parallel()
	for _, provider := range []string{"openai", "anthropic"} {
		t.Run(provider, func(t *testing.T) {
			t.Parallel()
			now := time.Now()
			var mu sync.Mutex
			calls := 0
			ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				mu.Lock()
				calls++
				page := calls
				mu.Unlock()
				var data []map[string]any
				for i := range 100 {
					b := map[string]any{"id": fmt.Sprintf("batch_%d_%d", page, i)}
					if provider == "openai" {
						b["created_at"], b["metadata"] = now.Unix(), map[string]string{"llmq_batch": "other"}
					} else {
						b["created_at"], b["request_counts"] = now.Format(time.RFC3339Nano), map[string]int{"processing": 1}
					}
					data = append(data, b)
				}
				w.Header().Set("content-type", "application/json")
				_ = json.NewEncoder(w).Encode(map[string]any{"data": data, "has_more": true})
			}))
			t.Cleanup(ts.Close)
			client, err := batchlane.NewClient(provider, ts.URL, "sk-test", ts.Client())
			require.NoError(t, err)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			got, err := client.Find(ctx, "lost", now.Add(-time.Minute), 2, func(string) bool { return false })
			require.Error(t, err, "not found among 10,000 batches made since: not known to be unsent")
			require.Empty(t, got)
			mu.Lock()
			defer mu.Unlock()
			require.Equal(t, 100, calls)
		})
	}
}

// TestClient_AnUnrecordedUploadIsDeleted: an OpenAI input file whose record fails (Submit's
// uploaded) is deleted and no batch is created, the send failing with the record's error; also
// when the record failed because the send's context ended (the worker stopping, the lead lost):
// the delete must not be cut with it, or the file, recorded nowhere, stays at the provider.
func TestClient_AnUnrecordedUploadIsDeleted(t *testing.T) {
	t.Parallel()
	for name, cancels := range map[string]bool{"RecordFails": false, "SendCanceled": true} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			sim := llmsim.New(llmsim.Config{})
			front := httptest.NewServer(sim)
			t.Cleanup(front.Close)
			client, err := batchlane.NewClient("openai", front.URL, "sk-test", front.Client())
			require.NoError(t, err)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			failed := errors.New("record the upload: the database is gone")
			_, err = client.Submit(ctx, "ref", []batchlane.Request{{CustomID: "a", Body: simBody["openai"]}},
				func(string) error {
					if cancels {
						cancel()
					}
					return failed
				})
			require.ErrorIs(t, err, failed)
			st := sim.BatchStats()
			require.Equal(t, 1, st.Uploads)
			require.Equal(t, 1, st.Deletes, "the unrecorded upload is left at the provider")
			require.Zero(t, st.Created)
		})
	}
}
