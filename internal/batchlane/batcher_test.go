package batchlane_test

import (
	"context"
	"encoding/json"
	"maps"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/batchlane"
	"github.com/llmq/llmq/internal/jobs"
	"github.com/llmq/llmq/internal/llmsim"
)

// fill is more than max_wait_to_fill (1m) since any job of a test was created: the fake clock
// is moved up to each job's creation (Postgres's clock) when it lags it (catchUp).
const fill = 2 * time.Minute

// TestBatcher_Succeeded: waiting jobs go in one batch once the oldest has waited
// max_wait_to_fill, become running with the provider's batch id, and succeed with the answer,
// usage and cost class batch when the batch ends; nothing goes online.
func TestBatcher_Succeeded(t *testing.T) {
	t.Parallel()
	for _, provider := range []string{"anthropic", "openai"} {
		t.Run(provider, func(t *testing.T) {
			t.Parallel()
			b := setup(t, setupOpts{provider: provider})
			bt := b.batcher(nil)
			j1, j2 := b.submit(t, "one", 0, 0), b.submit(t, "two", 0, 0)

			once(t, bt)
			require.Zero(t, b.sim.BatchStats().Created, "not full and not waited max_wait_to_fill: no batch yet")
			require.Equal(t, "waiting", *b.get(t, j1.ID).BatchState)

			b.clock.Advance(fill)
			once(t, bt)
			st := b.sim.BatchStats()
			require.Equal(t, 1, st.Created)
			require.Equal(t, 2, st.Requests)
			got := b.get(t, j1.ID)
			require.Equal(t, jobs.StatusRunning, got.Status)
			require.Equal(t, 1, got.Attempts)
			require.NotNil(t, got.BatchID)
			require.Equal(t, "in_progress", *got.BatchState)
			require.Equal(t, *got.BatchID, *b.get(t, j2.ID).BatchID, "one batch for one credential and model")

			b.clock.Advance(30 * time.Second)
			once(t, bt) // polled: still in progress
			require.Equal(t, jobs.StatusRunning, b.get(t, j1.ID).Status)

			b.clock.Advance(time.Hour)
			once(t, bt)
			for _, id := range []string{j1.ID, j2.ID} {
				got := b.get(t, id)
				require.Equal(t, jobs.StatusSucceeded, got.Status, "%+v", got.LastError)
				require.Equal(t, jobs.LaneBatch, got.Lane)
				require.Equal(t, "batch", *got.CostClass)
				require.Equal(t, "default", *got.AnsweredBy)
				var usage map[string]int
				require.NoError(t, json.Unmarshal(got.Usage, &usage))
				require.Positive(t, usage["output_tokens"])
				require.Contains(t, string(got.Result), "llmsim reply to:")
				require.Equal(t, []string{"queued", "running", "succeeded"}, b.events(t, id))
				attempts, err := b.store.Attempts(context.Background(), id)
				require.NoError(t, err)
				require.Len(t, attempts, 1)
				require.Equal(t, "ok", attempts[0].Class)
			}
			require.Empty(t, b.online())
			require.Equal(t, 1, b.sim.BatchStats().Created, "no batch sent twice")
		})
	}
}

// TestBatcher_FullBatchGoesAtOnce: max_requests_per_batch full jobs go without waiting to fill;
// the rest wait.
func TestBatcher_FullBatchGoesAtOnce(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{maxReqs: 2})
	for range 5 {
		b.submit(t, "x", 0, 0)
	}
	once(t, b.batcher(nil))
	st := b.sim.BatchStats()
	require.Equal(t, 2, st.Created)
	require.Equal(t, 4, st.Requests)
	waiting := 0
	for _, ref := range b.batchRefs(t) {
		if ref == "" {
			waiting++
		}
	}
	require.Equal(t, 1, waiting)
}

// TestBatcher_Outcomes: each per-request outcome maps onto the online lane's classes.
func TestBatcher_Outcomes(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	b.cfg.Window = 2 * time.Hour
	bt := b.batcher(nil)
	ok := b.submit(t, "fine", 0, 0)
	bad := b.submit(t, llmsim.DefaultBadRequestMarker, 0, 0)
	busy := b.submit(t, "llmsim-batch-overloaded", 0, 0)
	busySoon := b.submit(t, "llmsim-batch-overloaded", 3*time.Hour, 0)
	late := b.submit(t, "llmsim-batch-expire", 0, 0)
	spent := b.submit(t, "llmsim-batch-server-error", 0, 1)
	lastAttempt := b.submit(t, "llmsim-batch-expire", 0, 1)

	b.clock.Advance(fill)
	once(t, bt)
	first := *b.get(t, ok.ID).BatchID
	b.clock.Advance(time.Hour)
	once(t, bt)

	require.Equal(t, jobs.StatusSucceeded, b.get(t, ok.ID).Status)

	got := b.get(t, bad.ID)
	require.Equal(t, jobs.StatusFailed, got.Status, "a request error fails the job, as online")
	require.Equal(t, "permanent", got.LastError.Class)
	require.Equal(t, 400, got.LastError.Status)
	require.Equal(t, "invalid_request_error", got.LastError.Type)

	got = b.get(t, busy.ID)
	require.Equal(t, []string{"queued", "running", "retrying", "running"}, b.events(t, busy.ID),
		"an overload is retried, in a later batch: its deadline leaves room for a window")
	require.Equal(t, jobs.LaneBatch, got.Lane)
	require.NotEqual(t, first, *got.BatchID, "a new batch: never two at once")
	require.Equal(t, 1, got.Attempts, "an overload's round gives its attempt back")
	require.Equal(t, 529, got.LastError.Status)

	got = b.get(t, busySoon.ID)
	require.Equal(t, jobs.StatusRetrying, got.Status)
	require.Equal(t, jobs.LaneOnline, got.Lane, "online: no room for another window before its deadline")

	got = b.get(t, late.ID)
	require.Equal(t, jobs.StatusRetrying, got.Status, "an expired request is retried")
	require.Equal(t, jobs.LaneOnline, got.Lane, "online: the batch lane could not make it")
	require.Equal(t, "batch_expired", got.LastError.Type)

	got = b.get(t, spent.ID)
	require.Equal(t, jobs.StatusDead, got.Status, "no attempt left")
	require.Equal(t, jobs.ReasonRetriesExhausted, *got.DeadReason)
	require.Equal(t, 500, got.LastError.Status)
	require.Equal(t, jobs.LaneOnline, got.Lane, "an operator's retry of a dead letter runs online")

	got = b.get(t, lastAttempt.ID)
	require.Equal(t, jobs.StatusRetrying, got.Status, "an expired round gives its attempt back")
	require.Equal(t, 0, got.Attempts)
	require.Equal(t, jobs.LaneOnline, got.Lane)

	require.ElementsMatch(t, []string{busySoon.ID, late.ID, lastAttempt.ID}, b.online(),
		"the jobs for the online lane are enqueued")

	st := b.sim.BatchStats()
	require.Equal(t, 2, st.Created)
	require.Equal(t, 8, st.Requests, "seven jobs, then the one retried")

	for outcome, want := range map[string]float64{"succeeded": 1, "failed": 1, "rebatched": 1, "online": 3, "dead": 1} {
		require.Equal(t, want, b.counter(t, "jobs", outcome), outcome)
	}
	require.Equal(t, 2.0, b.counter(t, "batches", "sent"))
	require.Equal(t, 1.0, b.counter(t, "batches", "ended"))
	require.Zero(t, b.counter(t, "batches", "refused"), "every series starts at 0")
}

// TestBatcher_ProviderCanceled: a batch canceled at the provider (by an operator there) sends
// its jobs to the online lane.
func TestBatcher_ProviderCanceled(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	bt := b.batcher(nil)
	j := b.submit(t, "x", 0, 0)
	b.clock.Advance(fill)
	once(t, bt)
	require.NoError(t, b.client.Cancel(context.Background(), *b.get(t, j.ID).BatchID))
	b.clock.Advance(fill)
	once(t, bt)
	got := b.get(t, j.ID)
	require.Equal(t, jobs.StatusRetrying, got.Status)
	require.Equal(t, jobs.LaneOnline, got.Lane)
	require.Equal(t, "batch_canceled", got.LastError.Type)
	require.Equal(t, []string{j.ID}, b.online())
}

// refusing is a Client whose provider refuses every batch with status.
type refusing struct {
	batchlane.Client
	status int
	calls  *atomic.Int32 // counts the Submits when not nil
}

func (r refusing) Submit(context.Context, string, []batchlane.Request, func(string) error) (string, error) {
	if r.calls != nil {
		r.calls.Add(1)
	}
	return "", &batchlane.StatusError{Status: r.status, Body: "refused"}
}

// forgetting is a Client whose provider no longer knows any batch when polled.
type forgetting struct{ batchlane.Client }

func (forgetting) Poll(context.Context, string) (batchlane.State, error) {
	return batchlane.State{}, &batchlane.StatusError{Status: 404, Body: "not found"}
}

// TestBatcher_ProviderRefusesOrForgets: a batch the provider refuses as a whole (a 4xx) is not
// sent again: its jobs go online; a 5xx is retried on the next pass. A batch the provider no
// longer knows sends its jobs online too, as expired ones.
func TestBatcher_ProviderRefusesOrForgets(t *testing.T) {
	t.Parallel()

	t.Run("Refused", func(t *testing.T) {
		t.Parallel()
		b := setup(t, setupOpts{})
		j := b.submit(t, "x", 0, 0)
		b.clock.Advance(fill)
		once(t, b.batcher(refusing{Client: b.client, status: 413}))
		got := b.get(t, j.ID)
		require.Equal(t, jobs.StatusQueued, got.Status)
		require.Equal(t, jobs.LaneOnline, got.Lane)
		require.Equal(t, "batch_refused", got.LastError.Type)
		require.Equal(t, "refused", *got.BatchState)
		require.Equal(t, []string{j.ID}, b.online())
		require.Zero(t, got.Attempts, "nothing was sent")
	})

	t.Run("ServerErrorRetried", func(t *testing.T) {
		t.Parallel()
		b := setup(t, setupOpts{})
		j := b.submit(t, "x", 0, 0)
		b.clock.Advance(fill)
		var calls atomic.Int32
		down := b.batcher(refusing{Client: b.client, status: 503, calls: &calls})
		require.Error(t, down.Once(context.Background()))
		require.Equal(t, "committed", *b.get(t, j.ID).BatchState, "kept for the next pass")
		// Sent again after the backoff (the poll interval, doubling), not at every pass: a batch
		// API that is down is not asked once a second.
		for range 5 {
			require.NoError(t, down.Once(context.Background()))
		}
		require.Equal(t, int32(1), calls.Load())
		b.clock.Advance(30 * time.Second)
		require.Error(t, down.Once(context.Background()))
		require.Equal(t, int32(2), calls.Load())
		b.clock.Advance(30 * time.Second)
		require.NoError(t, down.Once(context.Background()), "the second backoff is twice the first")
		require.Equal(t, int32(2), calls.Load())
		b.clock.Advance(30 * time.Second)
		once(t, b.batcher(nil))
		require.Equal(t, jobs.StatusRunning, b.get(t, j.ID).Status)
		require.Equal(t, 1, b.sim.BatchStats().Created)
	})

	t.Run("Forgotten", func(t *testing.T) {
		t.Parallel()
		b := setup(t, setupOpts{})
		j := b.submit(t, "x", 0, 0)
		b.clock.Advance(fill)
		once(t, b.batcher(nil))
		b.clock.Advance(time.Minute)
		once(t, b.batcher(forgetting{b.client}))
		got := b.get(t, j.ID)
		require.Equal(t, jobs.StatusRetrying, got.Status)
		require.Equal(t, jobs.LaneOnline, got.Lane)
		require.Equal(t, []string{j.ID}, b.online())
	})
}

// failingPoll is a Client whose polls fail as a provider outage would.
type failingPoll struct {
	batchlane.Client
	calls *int
}

func (f failingPoll) Poll(context.Context, string) (batchlane.State, error) {
	*f.calls++
	return batchlane.State{}, &batchlane.StatusError{Status: 503, Body: "overloaded"}
}

// TestBatcher_PollFailuresBackOff: while the provider fails polls, the batch is polled with its
// backoff, not on every pass; once it answers, the results are recorded.
func TestBatcher_PollFailuresBackOff(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	j := b.submit(t, "x", 0, 0)
	b.clock.Advance(fill)
	once(t, b.batcher(nil))
	calls := 0
	down := b.batcher(failingPoll{Client: b.client, calls: &calls})
	b.clock.Advance(30 * time.Second)
	require.Error(t, down.Once(context.Background()))
	require.Equal(t, 1, calls, "polled when due")
	for range 5 {
		_ = down.Once(context.Background()) // not due again yet: no call
	}
	require.Equal(t, 1, calls)
	b.clock.Advance(2 * time.Hour)
	once(t, b.batcher(nil))
	require.Equal(t, jobs.StatusSucceeded, b.get(t, j.ID).Status)
}

// TestBatcher_LaneTurnedOff: with a credential's batch lane off, its waiting jobs go online and
// the batches it has are still polled to their end.
func TestBatcher_LaneTurnedOff(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	sent := b.submit(t, "x", 0, 0)
	b.clock.Advance(fill)
	once(t, b.batcher(nil))
	waiting := b.submit(t, "y", 0, 0)

	b.cfg.Enabled = false
	off := b.batcher(nil)
	once(t, off)
	got := b.get(t, waiting.ID)
	require.Equal(t, jobs.LaneOnline, got.Lane)
	require.Equal(t, "lane_off", *got.BatchState)
	require.Equal(t, []string{waiting.ID}, b.online())

	b.clock.Advance(2 * time.Hour)
	once(t, off)
	require.Equal(t, jobs.StatusSucceeded, b.get(t, sent.ID).Status)
	require.Equal(t, 1, b.sim.BatchStats().Created)
}

// TestBatcher_MalformedResultLine: a results file with a line that is not JSON (or names no
// job) still records every other job's result, for both providers; before, the one line failed
// the whole batch's results at every poll until the jobs' deadlines sent them online, their
// answers paid for and thrown away.
func TestBatcher_MalformedResultLine(t *testing.T) {
	t.Parallel()
	for _, provider := range []string{"anthropic", "openai"} {
		t.Run(provider, func(t *testing.T) {
			t.Parallel()
			b := setup(t, setupOpts{provider: provider})
			ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if !strings.HasSuffix(r.URL.Path, "/results") && !strings.HasSuffix(r.URL.Path, "/content") {
					b.sim.ServeHTTP(w, r)
					return
				}
				rec := httptest.NewRecorder()
				b.sim.ServeHTTP(rec, r)
				maps.Copy(w.Header(), rec.Header())
				w.Header().Del("Content-Length")
				w.WriteHeader(rec.Code)
				_, _ = w.Write(rec.Body.Bytes())
				_, _ = w.Write([]byte(`{"custom_id":"not-a-job","result":{"type":"succ` + "\n" + `{"result": {}}` + "\n"))
			}))
			t.Cleanup(ts.Close)
			client, err := batchlane.NewClient(provider, ts.URL, "sk-test", ts.Client())
			require.NoError(t, err)
			bt := b.batcher(client)
			j1, j2 := b.submit(t, "one", 0, 0), b.submit(t, "two", 0, 0)
			b.clock.Advance(fill)
			once(t, bt)
			b.clock.Advance(2 * time.Hour)
			once(t, bt)
			for _, id := range []string{j1.ID, j2.ID} {
				require.Equal(t, jobs.StatusSucceeded, b.get(t, id).Status, "the job's own line is fine")
			}
		})
	}
}

// TestBatcher_DatesEachPassThatSucceeds: a pass that succeeds sets
// llmq_batch_last_success_timestamp_seconds to when it started, there at 0 from the start (a
// worker that does not lead); one that fails (here: its send) leaves it. A leader whose passes
// hang or fail, or no leader at all, shows as a date that stops moving in every worker
// (LLMQBatchLaneStalled): before, nothing showed it.
func TestBatcher_DatesEachPassThatSucceeds(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	const name = "llmq_batch_last_success_timestamp_seconds"
	date := func() float64 {
		t.Helper()
		families, err := b.registry.Gather()
		require.NoError(t, err)
		for _, f := range families {
			if f.GetName() == name {
				return f.GetMetric()[0].GetGauge().GetValue()
			}
		}
		t.Fatalf("no metric %s", name)
		return 0
	}
	unix := func(t time.Time) float64 { return float64(t.UnixNano()) / 1e9 }
	require.Equal(t, float64(0), date(), "0 until a pass succeeds here")

	started := b.clock.Now()
	once(t, b.batcher(nil))
	require.Equal(t, unix(started), date())

	b.submit(t, "one", 0, 0)
	b.clock.Advance(fill)
	require.Error(t, b.batcher(flaky{Client: b.client}).Once(context.Background()))
	require.Equal(t, unix(started), date(), "a failed pass is not dated")

	b.clock.Advance(time.Hour) // past the failed send's backoff
	started = b.clock.Now()
	once(t, b.batcher(nil))
	require.Equal(t, unix(started), date())
	require.Equal(t, float64(1), b.counter(t, "batches", "sent"))
}

// TestBatcher_RateLimitedRequestIsRetried: a request a finished batch answered 429 (the batch's
// own rate limit, with no Retry-After to read: a results file has no headers) is retried, as
// an overload is, and pauses nothing: the credential's spend cap is read from the batch API's
// own answers (a refused send), not from a request's line. Its last error names the reason as
// the online lane does: OpenAI's error.code (rate_limit_exceeded), not error.type (requests).
func TestBatcher_RateLimitedRequestIsRetried(t *testing.T) {
	t.Parallel()
	for provider, typ := range map[string]string{"openai": "rate_limit_exceeded", "anthropic": "rate_limit_error"} {
		t.Run(provider, func(t *testing.T) {
			t.Parallel()
			ctx := t.Context()
			b := setup(t, setupOpts{provider: provider})
			p := b.pausable(t)
			bt := p.batcher(b)
			j := b.submit(t, "llmsim-batch-rate-limited", 0, 0)
			b.clock.Advance(fill)
			once(t, bt)
			b.clock.Advance(2 * time.Hour)
			once(t, bt)
			got := b.get(t, j.ID)
			require.Equal(t, jobs.StatusRetrying, got.Status)
			require.Equal(t, "retryable", got.LastError.Class)
			require.Equal(t, http.StatusTooManyRequests, got.LastError.Status)
			require.Equal(t, typ, got.LastError.Type)
			ps, err := p.gate.Paused(ctx)
			require.NoError(t, err)
			require.False(t, ps.Paused, "a request's 429 in a batch is no spend cap")
		})
	}
}
