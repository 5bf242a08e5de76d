package batchlane_test

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/batchlane"
	"github.com/llmq/llmq/internal/jobs"
)

// resultsFront is a front (setupOpts.front) that passes every call to the simulator but hands
// the body of a batch's results (Anthropic's results, OpenAI's file contents) to edit first,
// once per download; edit returns the body to send and whether to send it close-delimited (no
// length, no chunking: the end of the connection ends it, so a cut is a clean end of file).
type resultsFront struct {
	mu        sync.Mutex
	downloads int
	edit      func(n int, body []byte) (out []byte, closeDelimited bool)
}

func (f *resultsFront) wrap(sim http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet || !(strings.HasSuffix(r.URL.Path, "/results") || strings.HasSuffix(r.URL.Path, "/content")) {
			sim.ServeHTTP(w, r)
			return
		}
		rec := httptest.NewRecorder()
		sim.ServeHTTP(rec, r)
		f.mu.Lock()
		f.downloads++
		body, closeDelimited := f.edit(f.downloads, rec.Body.Bytes())
		f.mu.Unlock()
		if !closeDelimited {
			w.Header().Set("content-type", rec.Header().Get("content-type"))
			w.WriteHeader(rec.Code)
			_, _ = w.Write(body)
			return
		}
		conn, buf, err := http.NewResponseController(w).Hijack()
		if err != nil {
			panic(err)
		}
		defer conn.Close()
		_, _ = buf.WriteString("HTTP/1.1 200 OK\r\ncontent-type: application/binary\r\nconnection: close\r\n\r\n")
		_, _ = buf.Write(body)
		_ = buf.Flush()
	})
}

// TestBatcher_ResultsCutShortAreReadAgain: a results download whose connection ends early
// without an error (a close-delimited body, a proxy's cut) ends mid-line. Read as it came, the
// jobs whose lines were lost, answered and paid for in the batch, would be sent round again
// online (paid twice); the download is tried again instead, and every job gets its answer.
func TestBatcher_ResultsCutShortAreReadAgain(t *testing.T) {
	t.Parallel()
	for _, provider := range []string{"anthropic", "openai"} {
		t.Run(provider, func(t *testing.T) {
			t.Parallel()
			front := &resultsFront{edit: func(n int, body []byte) ([]byte, bool) {
				if n == 1 {
					// The second line cut in its middle.
					first := bytes.IndexByte(body, '\n') + 1
					return body[:first+(len(body)-first)/2], true
				}
				return body, false
			}}
			b := setup(t, setupOpts{provider: provider, front: front.wrap})
			bt := b.batcher(nil)
			j1, j2 := b.submit(t, "one", 0, 0), b.submit(t, "two", 0, 0)
			b.clock.Advance(fill)
			once(t, bt)
			b.clock.Advance(2 * time.Hour)
			require.Error(t, bt.Once(t.Context()), "the cut download")
			require.Equal(t, jobs.StatusRunning, b.get(t, j2.ID).Status)
			b.clock.Advance(10 * time.Minute)
			once(t, bt)
			for _, id := range []string{j1.ID, j2.ID} {
				got := b.get(t, id)
				require.Equal(t, jobs.StatusSucceeded, got.Status, "%s: %+v", id, got.LastError)
				require.Equal(t, 1, got.Attempts)
			}
			require.Empty(t, b.online(), "a job whose result line was cut went online, paid twice")
			require.Equal(t, 1, b.sim.BatchStats().Created)
		})
	}
}

// TestBatcher_DuplicateLineDoesNotUndoASuccess: a results file that holds a job's line twice,
// its answer and then an error, keeps the answer: the provider charged for it, and sent round
// again the job would be paid for twice.
func TestBatcher_DuplicateLineDoesNotUndoASuccess(t *testing.T) {
	t.Parallel()
	var dup []byte
	front := &resultsFront{edit: func(_ int, body []byte) ([]byte, bool) {
		return append(append([]byte{}, body...), dup...), false
	}}
	b := setup(t, setupOpts{provider: "anthropic", front: front.wrap})
	bt := b.batcher(nil)
	j1, j2 := b.submit(t, "one", 0, 0), b.submit(t, "two", 0, 0)
	dup = []byte(`{"custom_id":"` + j1.ID + `","result":{"type":"errored","error":{"type":"error","error":{"type":"api_error","message":"internal"}}}}` + "\n")
	b.clock.Advance(fill)
	once(t, bt)
	b.clock.Advance(2 * time.Hour)
	once(t, bt)
	for _, id := range []string{j1.ID, j2.ID} {
		got := b.get(t, id)
		require.Equal(t, jobs.StatusSucceeded, got.Status, "%s: %+v", id, got.LastError)
	}
	require.Empty(t, b.online())
}

// TestBatcher_FailedCancelWaitsItsBackoff: a batch none of whose jobs still wait is canceled at
// the provider; while its batch API fails the cancel (a 5xx, or a 429: the provider's side, not
// an answer that the batch is done), the cancel is tried again after the polls' backoff, as a
// failed poll or send is, not at every pass (once a second), and the batch is not closed: its
// requests would be paid for without a cancel.
func TestBatcher_FailedCancelWaitsItsBackoff(t *testing.T) {
	t.Parallel()
	for _, status := range []int{http.StatusServiceUnavailable, http.StatusTooManyRequests} {
		t.Run(http.StatusText(status), func(t *testing.T) {
			t.Parallel()
			failedCancelWaitsItsBackoff(t, status)
		})
	}
}

func failedCancelWaitsItsBackoff(t *testing.T, status int) {
	var mu sync.Mutex
	cancels, down := 0, true
	front := func(sim http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if strings.HasSuffix(r.URL.Path, "/cancel") {
				mu.Lock()
				cancels++
				failing := down
				mu.Unlock()
				if failing {
					w.Header().Set("content-type", "application/json")
					w.Header().Set("retry-after", "5")
					w.WriteHeader(status)
					_, _ = w.Write([]byte(`{"type":"error","error":{"type":"api_error","message":"unavailable"}}`))
					return
				}
			}
			sim.ServeHTTP(w, r)
		})
	}
	calls := func() int {
		mu.Lock()
		defer mu.Unlock()
		return cancels
	}
	b := setup(t, setupOpts{front: front})
	bt := b.batcher(nil)
	j := b.submit(t, "x", 0, 0)
	b.clock.Advance(fill)
	once(t, bt)
	_, err := b.store.Cancel(t.Context(), j.ID)
	require.NoError(t, err)
	b.clock.Advance(30 * time.Second)
	require.Error(t, bt.Once(t.Context()))
	require.Equal(t, 1, calls())
	for range 3 { // passes before the backoff ends
		_ = bt.Once(t.Context())
	}
	require.Equal(t, 1, calls(), "a failed cancel was tried again at every pass")

	mu.Lock()
	down = false
	mu.Unlock()
	b.clock.Advance(10 * time.Minute)
	once(t, bt)
	require.Equal(t, 2, calls())
	require.Equal(t, 1, b.sim.BatchStats().Cancels)
	once(t, bt)
	require.Equal(t, 2, calls(), "once canceled, the batch is closed")
}

// TestBatcher_BillingErrorInResultsIsASpendCap: a request of a finished batch answered with
// the provider's billing error (Anthropic billing_error, OpenAI insufficient_quota) is a spend
// cap, as the online lane reads the same answer: the job is dead-lettered
// (rate_limited_no_retry_after, for an operator to retry once the account pays again), not
// failed as if its request were wrong nor sent online to a key that cannot pay, and the
// credential is paused (in Postgres too), so that no more batches go until it is resumed.
func TestBatcher_BillingErrorInResultsIsASpendCap(t *testing.T) {
	t.Parallel()
	for _, provider := range []string{"anthropic", "openai"} {
		t.Run(provider, func(t *testing.T) {
			t.Parallel()
			ctx := t.Context()
			b := setup(t, setupOpts{provider: provider})
			p := b.pausable(t)
			bt := p.batcher(b)
			fine, billed := b.submit(t, "fine", 0, 0), b.submit(t, "llmsim-batch-billing", 0, 0)
			b.clock.Advance(fill)
			once(t, bt)
			b.clock.Advance(2 * time.Hour)
			_ = bt.Once(ctx)
			require.Equal(t, jobs.StatusSucceeded, b.get(t, fine.ID).Status)
			got := b.get(t, billed.ID)
			require.Equal(t, jobs.StatusDead, got.Status, "%+v", got.LastError)
			require.Equal(t, "rate_limited_no_retry_after", *got.DeadReason)
			require.Equal(t, "spend_cap", got.LastError.Class)
			require.Empty(t, b.online(), "a dead job is not enqueued")
			kept, err := p.pauses.Get(ctx, p.gate)
			require.NoError(t, err)
			require.True(t, kept.Paused, "the credential is paused")

			later := b.submit(t, "later", 0, 0)
			b.clock.Advance(fill)
			once(t, bt)
			require.Equal(t, 1, b.sim.BatchStats().Created, "a paused credential sends no batch")
			require.Empty(t, b.batchRefs(t)[later.ID])
		})
	}
}

// TestBatcher_FailedBatchSaysWhy: an OpenAI batch that failed as a whole (here past the
// organization's enqueued token limit, the batch API's quota) ran none of its requests and has
// no results file. Its jobs go online as a refused batch's do, their last error naming the
// provider's reason (token_limit_exceeded, its message), not an expiry that did not happen, and
// the batch is counted refused, not ended.
func TestBatcher_FailedBatchSaysWhy(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{provider: "openai", enqueuedTokens: 150})
	bt := b.batcher(nil)
	first := b.submit(t, strings.Repeat("a", 400), 0, 0) // 100 tokens
	b.clock.Advance(fill)
	once(t, bt)
	second := b.submit(t, strings.Repeat("b", 400), 0, 0) // 100 more: past the limit
	b.clock.Advance(fill)
	once(t, bt)
	require.Equal(t, 2, b.sim.BatchStats().Created)
	b.clock.Advance(time.Minute) // the second batch's first poll: failed
	once(t, bt)
	got := b.get(t, second.ID)
	require.Equal(t, jobs.StatusRetrying, got.Status)
	require.Equal(t, jobs.LaneOnline, got.Lane)
	require.Equal(t, "token_limit_exceeded", got.LastError.Type, "%+v", got.LastError)
	require.Contains(t, got.LastError.Message, "Enqueued token limit reached")
	require.Equal(t, []string{second.ID}, b.online())
	require.Equal(t, float64(1), b.counter(t, "batches", "refused"))
	require.Equal(t, float64(0), b.counter(t, "batches", "ended"))

	b.clock.Advance(2 * time.Hour)
	once(t, bt)
	require.Equal(t, jobs.StatusSucceeded, b.get(t, first.ID).Status)
}

// TestBatcher_ResultsPastTheReadCapAreRead: a results body longer than the client reads of an
// answer (1 GiB) is cut at the cap, mid-line, every time it is downloaded: it is not a cut
// download, to be fetched again at every poll until the jobs' deadlines (a GiB each time, the
// answered jobs held meanwhile), but read as far as the cap; a job whose line is past it goes
// round again.
func TestBatcher_ResultsPastTheReadCapAreRead(t *testing.T) {
	t.Parallel()
	for _, provider := range []string{"anthropic", "openai"} {
		t.Run(provider, func(t *testing.T) {
			t.Parallel()
			// A long last line, of a request llmq did not make, past the cap.
			front := &resultsFront{edit: func(_ int, body []byte) ([]byte, bool) {
				return append(append([]byte{}, body...), `{"custom_id":"other","pad":"`+strings.Repeat("x", 64<<10)+`"}`+"\n"...), false
			}}
			b := setup(t, setupOpts{provider: provider, front: front.wrap})
			batchlane.SetMaxAnswerLen(b.client, 16<<10)
			bt := b.batcher(nil)
			j1, j2 := b.submit(t, "one", 0, 0), b.submit(t, "two", 0, 0)
			b.clock.Advance(fill)
			once(t, bt)
			b.clock.Advance(2 * time.Hour)
			require.NoError(t, bt.Once(t.Context()), "the results were read as cut short")
			for _, id := range []string{j1.ID, j2.ID} {
				got := b.get(t, id)
				require.Equal(t, jobs.StatusSucceeded, got.Status, "%s: %+v", id, got.LastError)
			}
			front.mu.Lock()
			defer front.mu.Unlock()
			require.Equal(t, 1, front.downloads)
		})
	}
}
