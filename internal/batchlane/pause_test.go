package batchlane_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/batchlane"
	"github.com/llmq/llmq/internal/credpause"
	"github.com/llmq/llmq/internal/jobs"
	"github.com/llmq/llmq/internal/limiter"
	"github.com/llmq/llmq/internal/redistest"
)

// pausable is the default credential's limiter gate and its durable pauses, on the test's Redis
// namespace and database, as the worker gives them to the executor and the batcher.
type pausable struct {
	gate   *limiter.Gate
	pauses *credpause.Store
	// lose removes every key of the test's Redis namespace, as a restart without persistence
	// would.
	lose func()
}

func (b *testBundle) pausable(t *testing.T) *pausable {
	t.Helper()
	prefix := redistest.Prefix(t)
	lim, err := limiter.New(redistest.Client(t), &limiter.Config{Prefix: prefix, Now: b.clock.Now})
	require.NoError(t, err)
	return &pausable{gate: lim.Gate("sk-test", "default"), pauses: credpause.NewStore(b.pool, b.clock.Now),
		lose: func() {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			redistest.Unlink(ctx, redistest.Client(t), prefix+"*")
		}}
}

// batcher returns a batcher of the default credential whose lane reads p's pause.
func (p *pausable) batcher(b *testBundle) *batchlane.Batcher {
	return batchlane.New(batchlane.Config{Pool: b.pool, Now: b.clock.Now, Metrics: b.metrics, Pauses: p.pauses,
		Lanes:   []batchlane.Lane{{Credential: "default", Client: b.client, Config: b.cfg, Gate: p.gate}},
		Enqueue: b.enqueue})
}

// TestBatcher_PausedCredentialHoldsSends: while the credential is paused (a spend cap, as the
// executor pauses it), its lane sends no batch: waiting jobs stay waiting (no batch row), a batch
// committed before the pause stays unsent, also after Redis lost the pause (restored from
// Postgres), and a job whose deadline comes near still goes online. A batch sent before the
// pause is still polled to its end (it is paid for). After the resume both batches go.
func TestBatcher_PausedCredentialHoldsSends(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, setupOpts{})
	p := b.pausable(t)
	bt := p.batcher(b)

	sent := b.submit(t, "sent before the pause", 0, 0)
	b.clock.Advance(fill)
	once(t, bt)
	require.Equal(t, 1, b.sim.BatchStats().Created)
	require.Equal(t, jobs.StatusRunning, b.get(t, sent.ID).Status)

	committed := b.submit(t, "committed before the pause", 0, 0)
	b.clock.Advance(fill)
	crashing := p.batcher(b)
	batchlane.CrashAfterCommit(crashing, context.Canceled)
	require.ErrorIs(t, crashing.Once(ctx), context.Canceled)
	require.NotEmpty(t, b.batchRefs(t)[committed.ID], "committed, not sent")
	require.Equal(t, 1, b.sim.BatchStats().Created)

	started, err := p.pauses.Pause(ctx, p.gate, "spend_cap", sent.ID)
	require.NoError(t, err)
	require.True(t, started)
	waiting := b.submit(t, "waiting", 0, 0)
	near := b.submit(t, "near its deadline", 30*time.Minute, 0)
	b.clock.Advance(fill)
	once(t, bt)
	require.Equal(t, 1, b.sim.BatchStats().Created, "a paused credential sends no batch")
	require.Empty(t, b.batchRefs(t)[waiting.ID], "its waiting jobs stay waiting, in no batch")
	require.Equal(t, "waiting", *b.get(t, waiting.ID).BatchState)

	p.lose()
	once(t, bt)
	require.Equal(t, 1, b.sim.BatchStats().Created, "a pause Redis lost still holds the sends")
	ps, err := p.gate.Paused(ctx)
	require.NoError(t, err)
	require.True(t, ps.Paused, "restored from Postgres")

	b.clock.Set(near.Deadline.Add(-b.cfg.OnlineFallback))
	once(t, bt)
	require.Equal(t, []string{near.ID}, b.online(), "within online_fallback of its deadline: online, as unpaused")
	require.Equal(t, jobs.LaneOnline, b.get(t, near.ID).Lane)

	b.clock.Advance(time.Hour)
	once(t, bt)
	got := b.get(t, sent.ID)
	require.Equal(t, jobs.StatusSucceeded, got.Status, "the batch sent before the pause is polled to its end: %+v", got.LastError)
	require.Equal(t, 1, b.sim.BatchStats().Created)
	require.Equal(t, jobs.StatusQueued, b.get(t, committed.ID).Status)

	resumed, err := p.pauses.Resume(ctx, p.gate)
	require.NoError(t, err)
	require.True(t, resumed)
	once(t, bt)
	st := b.sim.BatchStats()
	require.Equal(t, 3, st.Created, "after the resume the committed batch and the waiting jobs' go")
	require.Equal(t, 3, st.Requests)
	for _, id := range []string{committed.ID, waiting.ID} {
		require.Equal(t, jobs.StatusRunning, b.get(t, id).Status)
	}
	require.Equal(t, []string{near.ID}, b.online())
}

// TestBatcher_UnreadablePauseHoldsSends: a pause that cannot be read (Redis does not answer) holds
// the lane's sends, as a pause would, and the pass returns the error naming the credential.
func TestBatcher_UnreadablePauseHoldsSends(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	p := b.pausable(t)
	down := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1, DialTimeout: time.Second})
	t.Cleanup(func() { _ = down.Close() })
	lim, err := limiter.New(down, &limiter.Config{Prefix: redistest.Prefix(t), Now: b.clock.Now})
	require.NoError(t, err)
	p.gate = lim.Gate("sk-test", "default")
	bt := p.batcher(b)

	waiting := b.submit(t, "waiting", 0, 0)
	b.clock.Advance(fill)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	require.ErrorContains(t, bt.Once(ctx), "read the pause of credential default")
	require.Zero(t, b.sim.BatchStats().Created, "no batch sent while the pause cannot be read")
	require.Empty(t, b.batchRefs(t)[waiting.ID], "the job waits, in no batch")
}

// capping is the simulator behind a front that, while capped, answers the creation of a batch
// as a spent Anthropic key does: 429 rate_limit_error, error.details.error_code
// enforced_spend_limit_reached, no Retry-After (OpenAI answers 429 insufficient_quota, also
// without one). creates counts the creations it refused.
type capping struct {
	client  batchlane.Client
	capped  atomic.Bool
	refused atomic.Int32
}

func (b *testBundle) capping(t *testing.T) *capping {
	t.Helper()
	c := &capping{}
	front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if c.capped.Load() && r.Method == http.MethodPost && r.URL.Path == "/v1/messages/batches" {
			c.refused.Add(1)
			w.Header().Set("content-type", "application/json")
			w.WriteHeader(http.StatusTooManyRequests)
			_, _ = io.WriteString(w, `{"type":"error","error":{"type":"rate_limit_error","message":"spend limit reached",`+
				`"details":{"error_code":"enforced_spend_limit_reached"}}}`)
			return
		}
		b.sim.ServeHTTP(w, r)
	}))
	t.Cleanup(front.Close)
	client, err := batchlane.NewClient("anthropic", front.URL, "sk-test", front.Client())
	require.NoError(t, err)
	c.client = client
	return c
}

// TestBatcher_SpendCapOnSendPausesTheCredential: a batch API that answers a send 429 without
// Retry-After (a spend cap, as the online lane classifies it) pauses the credential, in Postgres
// too, as the executor does for an online answer: the batch stays committed, unsent, and no
// send is tried again until the credential is resumed.
func TestBatcher_SpendCapOnSendPausesTheCredential(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := setup(t, setupOpts{})
	p := b.pausable(t)
	c := b.capping(t)
	c.capped.Store(true)
	b.client = c.client
	bt := p.batcher(b)

	job := b.submit(t, "on a spent key", 0, 0)
	b.clock.Advance(fill)
	_ = bt.Once(ctx) // the pass reports the refused send
	ps, err := p.gate.Paused(ctx)
	require.NoError(t, err)
	require.True(t, ps.Paused, "a 429 without Retry-After on the batch API pauses the credential")
	kept, err := p.pauses.Get(ctx, p.gate)
	require.NoError(t, err)
	require.True(t, kept.Paused, "kept in Postgres")
	require.Equal(t, int32(1), c.refused.Load())

	c.capped.Store(false)
	b.clock.Advance(time.Hour)
	once(t, bt)
	require.Equal(t, int32(1), c.refused.Load())
	require.Zero(t, b.sim.BatchStats().Created, "nothing is sent while paused")
	require.NotEmpty(t, b.batchRefs(t)[job.ID], "the batch stays committed")

	_, err = p.pauses.Resume(ctx, p.gate)
	require.NoError(t, err)
	once(t, bt)
	require.Equal(t, 1, b.sim.BatchStats().Created, "sent once resumed")
	require.Equal(t, jobs.StatusRunning, b.get(t, job.ID).Status)
}

// TestBatcher_PausedBatchOnlyCredentialIsProbed: a paused credential whose traffic is all in
// the batch lane is probed, as the online lane probes its own (one request per
// pause_probe_interval): the interval's first send goes as the probe; refused again with a
// spend cap, the credential stays paused and nothing more is sent until the next interval;
// accepted, the credential is resumed and the lane sends again.
func TestBatcher_PausedBatchOnlyCredentialIsProbed(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := setup(t, setupOpts{maxReqs: 1})
	p := b.pausable(t)
	c := b.capping(t)
	c.capped.Store(true)
	b.client = c.client
	bt := batchlane.New(batchlane.Config{Pool: b.pool, Now: b.clock.Now, Metrics: b.metrics, Pauses: p.pauses,
		Lanes: []batchlane.Lane{{Credential: "default", Client: b.client, Config: b.cfg, Gate: p.gate,
			PauseProbeInterval: 5 * time.Minute}},
		Enqueue: func(context.Context, string, jobs.Priority) error { return nil }})

	started, err := p.pauses.Pause(ctx, p.gate, "rate_limited_no_retry_after", "")
	require.NoError(t, err)
	require.True(t, started)
	first := b.submit(t, "first", 0, 0)
	second := b.submit(t, "second", 0, 0)
	once(t, bt)
	require.Zero(t, c.refused.Load(), "no probe before the interval")

	b.clock.Advance(5 * time.Minute)
	_ = bt.Once(ctx)
	require.Equal(t, int32(1), c.refused.Load(), "one probe, refused: the other batch is not sent")
	ps, err := p.gate.Paused(ctx)
	require.NoError(t, err)
	require.True(t, ps.Paused, "still paused")
	once(t, bt)
	require.Equal(t, int32(1), c.refused.Load(), "the next probe waits its interval")

	c.capped.Store(false)
	b.clock.Advance(5 * time.Minute)
	once(t, bt)
	ps, err = p.gate.Paused(ctx)
	require.NoError(t, err)
	require.False(t, ps.Paused, "the probe got through: resumed")
	kept, err := p.pauses.Get(ctx, p.gate)
	require.NoError(t, err)
	require.False(t, kept.Paused, "in Postgres too")
	require.Equal(t, 2, b.sim.BatchStats().Created, "the probe's batch and, resumed, the other")
	for _, id := range []string{first.ID, second.ID} {
		require.Equal(t, jobs.StatusRunning, b.get(t, id).Status)
	}
}

// cancelingFind is a client whose look-up (Find, the send of a batch begun before) ends the
// pass as a leader that lost its lock, or a worker shutting down, sees it: cancel is called and
// the look-up fails with the pass's context.
type cancelingFind struct {
	batchlane.Client
	cancel atomic.Pointer[context.CancelFunc]
}

func (c *cancelingFind) Find(ctx context.Context, ref string, since time.Time, n int, taken func(string) bool) (string, error) {
	if cancel := c.cancel.Load(); cancel != nil {
		(*cancel)()
		return "", ctx.Err()
	}
	return c.Client.Find(ctx, ref, since, n, taken)
}

// TestBatcher_ProbeOfACanceledPassIsGivenBack: a pass that took the pause's probe and ends
// canceled (its leader lost the lock, or the worker stops) before any send used it gives it
// back, as the executor gives back an unsent attempt's (on a context without its cancel): the
// credential's next probe, the online lane's or the next leader's, may go at once rather than
// an interval later.
func TestBatcher_ProbeOfACanceledPassIsGivenBack(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	p := b.pausable(t)
	c := b.capping(t)
	c.capped.Store(true)
	client := &cancelingFind{Client: c.client}
	const every = 5 * time.Minute
	bt := batchlane.New(batchlane.Config{Pool: b.pool, Now: b.clock.Now, Metrics: b.metrics, Pauses: p.pauses,
		Lanes: []batchlane.Lane{{Credential: "default", Client: client, Config: b.cfg, Gate: p.gate,
			PauseProbeInterval: every}},
		Enqueue: func(context.Context, string, jobs.Priority) error { return nil }})

	b.submit(t, "on a spent key", 0, 0)
	b.clock.Advance(fill)
	_ = bt.Once(t.Context()) // refused with a spend cap: paused, the batch committed, its send begun
	ps, err := p.gate.Paused(t.Context())
	require.NoError(t, err)
	require.True(t, ps.Paused)

	b.clock.Advance(every)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	client.cancel.Store(&cancel)
	require.ErrorIs(t, bt.Once(ctx), context.Canceled, "the pass took the probe, then was canceled in the look-up")
	require.Equal(t, int32(1), c.refused.Load(), "nothing sent")

	probe, err := p.gate.TryProbe(t.Context(), every)
	require.NoError(t, err)
	require.True(t, probe.Granted(), "the canceled pass's unsent probe was given back")
	require.NoError(t, p.gate.ReleaseProbe(t.Context(), probe))
}

// diesInSend is a client whose first Submit ends its pass as a leader's death does mid-send
// (the pass's context canceled, the request's fate unknown: the batch keeps its send claim), and
// whose Polls call onPoll, where a test looks at the limiter as the online lane would meanwhile.
type diesInSend struct {
	batchlane.Client
	cancel atomic.Pointer[context.CancelFunc]
	onPoll atomic.Pointer[func()]
}

func (c *diesInSend) Submit(ctx context.Context, ref string, reqs []batchlane.Request,
	uploaded func(string) error) (string, error) {
	if cancel := c.cancel.Swap(nil); cancel != nil {
		(*cancel)()
		return "", ctx.Err()
	}
	return c.Client.Submit(ctx, ref, reqs, uploaded)
}

func (c *diesInSend) Poll(ctx context.Context, id string) (batchlane.State, error) {
	if f := c.onPoll.Load(); f != nil {
		(*f)()
	}
	return c.Client.Poll(ctx, id)
}

// TestBatcher_NoProbeForASendNotDue: a committed batch whose send is not due (another send's
// claim, here a leader that died mid-send, or a failed send's backoff) takes no pause probe: its
// pass would send nothing with it, and while the pass goes on (polling the other batches) the
// online lane's attempts would be refused the probe, every pass, until that send is due.
func TestBatcher_NoProbeForASendNotDue(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{maxReqs: 1})
	p := b.pausable(t)
	client := &diesInSend{Client: b.client}
	const every = 10 * time.Second
	bt := batchlane.New(batchlane.Config{Pool: b.pool, Now: b.clock.Now, Metrics: b.metrics, Pauses: p.pauses,
		Lanes: []batchlane.Lane{{Credential: "default", Client: client, Config: b.cfg, Gate: p.gate,
			PauseProbeInterval: every}},
		Enqueue: func(context.Context, string, jobs.Priority) error { return nil }})

	claimed := b.submit(t, "its sender died mid-send", 0, 0)
	dead, cancel := context.WithCancel(t.Context())
	defer cancel()
	client.cancel.Store(&cancel)
	require.Error(t, bt.Once(dead))
	require.NotEmpty(t, b.batchRefs(t)[claimed.ID], "committed, its send claimed")

	sent := b.submit(t, "sent", 0, 0)
	once(t, bt)
	require.Equal(t, 1, b.sim.BatchStats().Created)
	require.Equal(t, jobs.StatusRunning, b.get(t, sent.ID).Status)

	started, err := p.pauses.Pause(t.Context(), p.gate, "rate_limited_no_retry_after", "")
	require.NoError(t, err)
	require.True(t, started)
	b.clock.Advance(b.cfg.PollInterval) // the probe's interval is past; the sent batch's poll is due, the claim is not over
	var online []bool
	look := func() {
		probe, err := p.gate.TryProbe(t.Context(), every)
		require.NoError(t, err)
		online = append(online, probe.Granted())
		require.NoError(t, p.gate.ReleaseProbe(t.Context(), probe))
	}
	client.onPoll.Store(&look)
	once(t, bt)
	require.Equal(t, []bool{true}, online, "the online lane may probe during the pass: the batch lane had no send to probe with")
	require.Equal(t, 1, b.sim.BatchStats().Created, "the claimed batch is not sent")
}
