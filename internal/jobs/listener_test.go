package jobs_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/jobs"
	"github.com/llmq/llmq/internal/jobstest"
	"github.com/llmq/llmq/internal/pgtest"
	"github.com/llmq/llmq/internal/redistest"
)

// listenerBundle is a store and a running Listener on its database.
type listenerBundle struct {
	*jobstest.Bundle
	listener *jobs.Listener
	appName  string
}

func setupListener(t *testing.T) *listenerBundle {
	t.Helper()
	return setupListenerWith(t, jobs.ListenerConfig{}, 0)
}

// setupListenerWith is setupListener with the Listener's configuration lc (its ConnConfig and a
// zero ReconnectDelay set here), reading catch-up pages of page jobs when page > 0.
func setupListenerWith(t *testing.T, lc jobs.ListenerConfig, page int) *listenerBundle {
	t.Helper()
	b := jobstest.New(t)
	cfg, err := pgx.ParseConfig(b.URL)
	require.NoError(t, err)
	appName := "llmq-listener-test-" + redistest.Rand()
	cfg.RuntimeParams["application_name"] = appName
	lc.ConnConfig = cfg
	if lc.ReconnectDelay == 0 {
		lc.ReconnectDelay = 10 * time.Millisecond
	}
	l := jobs.NewListener(lc)
	if page > 0 {
		jobs.SetCatchUpPage(l, page)
	}
	// A subscription made before Run gets 0 once the connection listens (LISTEN done, and the
	// broadcast made): from then on, every notification reaches every subscriber.
	probe, unsubscribe := l.Subscribe("probe")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- l.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
	})
	require.Equal(t, 0, next(t, probe))
	unsubscribe()
	return &listenerBundle{Bundle: b, listener: l, appName: appName}
}

// next returns the next signal or fails after a generous timeout.
func next(t *testing.T, ch <-chan int) int {
	t.Helper()
	return nextWithin(t, ch, 30*time.Second, "next")
}

// nextWithin returns the next signal, failing with what when none comes within d.
func nextWithin(t *testing.T, ch <-chan int, d time.Duration, what string) int {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(d):
		t.Fatalf("%s: no signal within %s", what, d)
		return 0
	}
}

// nextAnnounced is the next signal that announces an event, skipping the 0s of reconnects (a
// reconnect's "re-read" may come before it, or be coalesced with it: 0 wins), within 10 s.
func nextAnnounced(t *testing.T, ch <-chan int) int {
	t.Helper()
	deadline := time.After(30 * time.Second)
	for {
		select {
		case v := <-ch:
			if v != 0 {
				return v
			}
		case <-deadline:
			t.Fatal("no announced event within 30s")
			return 0
		}
	}
}

// connected subscribes to the (already listening) listener.
func (b *listenerBundle) connected(t *testing.T, id string) (<-chan int, func()) {
	t.Helper()
	ch, cancel := b.listener.Subscribe(id)
	t.Cleanup(cancel)
	return ch, cancel
}

// listening reports whether the listener's session is connected and idle (LISTEN done).
func (b *listenerBundle) listening(t *testing.T) bool {
	t.Helper()
	var n int
	require.NoError(t, b.Pool.QueryRow(context.Background(),
		`SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 AND state = 'idle' AND query LIKE 'LISTEN%'`,
		b.appName).Scan(&n))
	return n == 1
}

// notify announces a transition the way the store does, with a payload of our choosing.
func (b *listenerBundle) notify(t *testing.T, payload string) {
	t.Helper()
	_, err := b.Pool.Exec(context.Background(), `SELECT pg_notify($1, $2)`, jobs.EventsChannel, payload)
	require.NoError(t, err)
}

func TestListener_SignalsOnlyTheSubscribedJob(t *testing.T) {
	t.Parallel()
	b := setupListener(t)
	chA, _ := b.connected(t, "job-a")
	chB, _ := b.connected(t, "job-b")

	// Had job-b's signal reached job-a's channel, 7 would be pending there and 3 dropped.
	b.notify(t, "job-b:7")
	b.notify(t, "not a payload")
	b.notify(t, "job-a:x")
	b.notify(t, "job-a:3")
	require.Equal(t, 3, next(t, chA))
	require.Equal(t, 7, next(t, chB))
}

func TestListener_SignalsStoreTransitions(t *testing.T) {
	t.Parallel()
	b := setupListener(t)
	job := b.Create(t, jobstest.Opts{})
	// Only watched jobs' transitions are announced (the creation's was not: it came first).
	require.NoError(t, b.Store.Watch(context.Background(), job.ID, time.Minute))
	ch, _ := b.connected(t, job.ID)
	// The creation's notification may still be on its way. Postgres delivers notifications in
	// commit order, so once a later one has been dispatched, it has been too: drop its signal.
	barrier, _ := b.connected(t, "barrier")
	b.notify(t, "barrier:1")
	require.Equal(t, 1, next(t, barrier))
	select {
	case v := <-ch:
		require.Equal(t, 1, v)
	default:
	}

	_, err := b.Store.BeginAttempt(context.Background(), job.ID)
	require.NoError(t, err)
	require.Equal(t, 2, next(t, ch))
	_, err = b.Store.Cancel(context.Background(), job.ID)
	require.NoError(t, err)
	require.Equal(t, 3, next(t, ch))
}

func TestListener_UnwatchedJobsAreNotAnnounced(t *testing.T) {
	t.Parallel()
	b := setupListener(t)
	job := b.Create(t, jobstest.Opts{})
	ch, _ := b.connected(t, job.ID)
	barrier, _ := b.connected(t, "barrier")
	_, err := b.Store.BeginAttempt(context.Background(), job.ID)
	require.NoError(t, err)
	// Postgres delivers notifications in commit order: once the barrier's has arrived, the
	// attempt's would have too.
	b.notify(t, "barrier:1")
	require.Equal(t, 1, next(t, barrier))
	select {
	case v := <-ch:
		require.Zero(t, v, "an unwatched job's transition was announced (seq %d)", v)
	default:
	}
}

func TestListener_FansOutOnOneConnection(t *testing.T) {
	t.Parallel()
	b := setupListener(t)
	const n = 20
	chans := make([]<-chan int, n)
	for i := range n {
		chans[i], _ = b.connected(t, "job-a")
	}
	require.Equal(t, n, b.listener.Subscribers())

	b.notify(t, "job-a:2")
	for _, ch := range chans {
		require.Equal(t, 2, next(t, ch))
	}
	var conns int
	require.NoError(t, b.Pool.QueryRow(context.Background(),
		`SELECT count(*) FROM pg_stat_activity WHERE application_name = $1`, b.appName).Scan(&conns))
	require.Equal(t, 1, conns)
}

func TestListener_ReconnectSignalsZero(t *testing.T) {
	t.Parallel()
	b := setupListener(t)
	ch, _ := b.connected(t, "job-a")

	var killed bool
	require.NoError(t, b.Pool.QueryRow(context.Background(),
		`SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1`, b.appName).Scan(&killed))
	require.True(t, killed)

	// After reconnecting, every subscriber is told to re-read (whatever committed meanwhile was
	// not announced to it), and signals flow again.
	require.Equal(t, 0, next(t, ch))
	require.Eventually(t, func() bool { return b.listening(t) }, 30*time.Second, 5*time.Millisecond)
	b.notify(t, "job-a:5")
	require.Equal(t, 5, next(t, ch))
}

func TestListener_Unsubscribe(t *testing.T) {
	t.Parallel()
	b := setupListener(t)
	job := b.Create(t, jobstest.Opts{})
	_, cancel1 := b.listener.Subscribe(job.ID)
	_, cancel2 := b.listener.Subscribe(job.ID)
	require.Equal(t, 2, b.listener.Subscribers())
	cancel1()
	cancel1() // idempotent
	require.Equal(t, 1, b.listener.Subscribers())
	cancel2()
	require.Equal(t, 0, b.listener.Subscribers())
}

func TestListener_UnreachableKeepsRetryingUntilCanceled(t *testing.T) {
	t.Parallel()
	cfg, err := pgx.ParseConfig("postgres://postgres@127.0.0.1:1/x?sslmode=disable&connect_timeout=1")
	require.NoError(t, err)
	l := jobs.NewListener(jobs.ListenerConfig{ConnConfig: cfg, ReconnectDelay: time.Millisecond, MaxReconnectDelay: 5 * time.Millisecond})
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	require.NoError(t, l.Run(ctx), "Run ends without error when its context ends")
}

// WatchAndRead watches the job and reads its events after a sequence number and the job in one
// round trip: the events and the job are those committed before it, and the transitions after
// it are announced.
func TestListener_WatchAndReadAnnouncesWhatFollows(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setupListener(t)
	job := b.Create(t, jobstest.Opts{})
	_, err := b.Store.BeginAttempt(ctx, job.ID) // before the watch: read, not announced
	require.NoError(t, err)
	ch, _ := b.connected(t, job.ID)

	evs, got, err := b.Store.WatchAndRead(ctx, job.ID, time.Minute, 0)
	require.NoError(t, err)
	require.Len(t, evs, 2)
	require.Equal(t, []jobs.Status{jobs.StatusQueued, jobs.StatusRunning}, []jobs.Status{evs[0].Type, evs[1].Type})
	require.Equal(t, jobs.StatusRunning, got.Status)
	require.Equal(t, 2, got.EventSeq)
	evs, _, err = b.Store.WatchAndRead(ctx, job.ID, time.Minute, 1)
	require.NoError(t, err)
	require.Len(t, evs, 1, "only the events after the sequence number given")

	_, err = b.Store.Cancel(ctx, job.ID)
	require.NoError(t, err)
	require.Equal(t, 3, next(t, ch), "a transition after the watch is announced")

	for _, id := range []string{"0190a5b2-7c1e-7d3f-9a8b-123456789abc", "nope"} {
		_, _, err = b.Store.WatchAndRead(ctx, id, time.Minute, 0)
		require.ErrorIs(t, err, jobs.ErrNotFound)
	}
}

// TestListener_SilentConnectionIsReplaced: a LISTEN connection that goes silent without an
// error (a partition, a failover behind a moved address: no reset ever comes) is found by the
// Listener's ping and replaced; its subscribers are told to re-read, and the transitions
// announced after it reach them. Without the ping it waited on the silent connection for ever,
// and every event stream of the process heard of transitions only at its keep-alive.
func TestListener_SilentConnectionIsReplaced(t *testing.T) {
	t.Parallel()
	b := jobstest.New(t)
	proxy, viaProxy := pgtest.NewProxy(t, b.URL)
	cfg, err := pgx.ParseConfig(viaProxy)
	require.NoError(t, err)
	// 200 ms: short for the test, long enough that a loaded machine (-race) rarely fails a
	// healthy ping; a reconnect it makes anyway signals 0, which the reads below skip.
	l := jobs.NewListener(jobs.ListenerConfig{ConnConfig: cfg, ReconnectDelay: 10 * time.Millisecond,
		PingInterval: 200 * time.Millisecond})
	ch, unsubscribe := l.Subscribe("job-a")
	defer unsubscribe()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- l.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
	})
	notify := func(payload string) {
		_, err := b.Pool.Exec(context.Background(), `SELECT pg_notify($1, $2)`, jobs.EventsChannel, payload)
		require.NoError(t, err)
	}
	require.Equal(t, 0, next(t, ch), "listening")
	notify("job-a:1")
	require.Equal(t, 1, nextAnnounced(t, ch))

	proxy.Freeze()
	notify("job-a:2") // lost on the silent connection: the re-read after the new LISTEN finds it
	require.Equal(t, 0, next(t, ch), "a new connection listens")
	notify("job-a:3")
	require.Equal(t, 3, nextAnnounced(t, ch))
}

// WatchLatest watches the job and returns its latest event's sequence number in one statement:
// what an event stream's keep-alive learns, instead of reading the events, and the transitions
// after it are announced.
func TestListener_WatchLatestAnnouncesWhatFollows(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setupListener(t)
	job := b.Create(t, jobstest.Opts{})
	_, err := b.Store.BeginAttempt(ctx, job.ID) // before the watch: counted, not announced
	require.NoError(t, err)
	ch, _ := b.connected(t, job.ID)

	seq, err := b.Store.WatchLatest(ctx, job.ID, time.Minute)
	require.NoError(t, err)
	require.Equal(t, 2, seq, "queued and running")

	_, err = b.Store.Cancel(ctx, job.ID)
	require.NoError(t, err)
	require.Equal(t, 3, next(t, ch), "a transition after the watch is announced")
	seq, err = b.Store.WatchLatest(ctx, job.ID, time.Minute)
	require.NoError(t, err)
	require.Equal(t, 3, seq)

	for _, id := range []string{"0190a5b2-7c1e-7d3f-9a8b-123456789abc", "nope"} {
		_, err = b.Store.WatchLatest(ctx, id, time.Minute)
		require.ErrorIs(t, err, jobs.ErrNotFound)
	}
}

// After reconnecting, each subscriber is signalled with its job's latest event number, read for
// all of them in one statement, instead of 0: a subscriber that read that far reads nothing
// (before, every event stream of the process read its job's events and the job at once, on a
// Postgres just back). A job that does not exist (deleted since) is signalled 0: read it.
func TestListener_ReconnectSignalsLatestEvent(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setupListener(t)
	job := b.Create(t, jobstest.Opts{})
	_, err := b.Store.BeginAttempt(ctx, job.ID)
	require.NoError(t, err)
	moved, _ := b.connected(t, job.ID)
	gone, _ := b.connected(t, "0190a5b2-7c1e-7d3f-9a8b-123456789abc")
	notJob, _ := b.connected(t, "job-a")

	var killed bool
	require.NoError(t, b.Pool.QueryRow(ctx,
		`SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1`, b.appName).Scan(&killed))
	require.True(t, killed)
	require.Equal(t, 2, next(t, moved), "queued and running")
	require.Equal(t, 0, next(t, gone))
	require.Equal(t, 0, next(t, notJob))
}

// Coalesced signals keep the highest (a subscriber that read up to a lower one would otherwise
// skip the read the higher one calls for), and 0 (read: what was missed is unknown) over any.
func TestListener_CoalescedSignalIsTheHighest(t *testing.T) {
	t.Parallel()
	b := setupListener(t)
	a, _ := b.connected(t, "job-a")
	barrier, _ := b.connected(t, "job-b")

	b.notify(t, "job-a:3")
	b.notify(t, "job-a:5")
	b.notify(t, "job-a:4")
	b.notify(t, "job-b:1") // delivered after job-a's, on the same connection
	require.Equal(t, 1, next(t, barrier))
	require.Equal(t, 5, next(t, a))

	b.notify(t, "job-a:6")
	b.notify(t, "job-b:2")
	require.Equal(t, 2, next(t, barrier)) // job-a:6 is pending
	var killed bool
	require.NoError(t, b.Pool.QueryRow(context.Background(),
		`SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1`, b.appName).Scan(&killed))
	require.True(t, killed)
	require.Equal(t, 0, next(t, barrier), "job-b is no job: its catch-up is 0, sent with job-a's")
	b.listener.Subscribers() // the catch-up's signals are all sent
	require.Equal(t, 0, next(t, a), "job-a:6, then the catch-up's 0")
}

// A reconnect renews the watches of the subscribed jobs: after a Postgres outage longer than a
// watch (4 keep-alives: 60 s), the streams' renewals having failed all along, their jobs'
// watches had ended, and a transition right after the reconnect was announced to no one: its
// stream learned of it at its next keep-alive only, up to 15 s late. The watch is renewed in the
// statement that reads the latest events, so a transition after that read is announced.
func TestListener_ReconnectRenewsExpiredWatches(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setupListener(t)
	job := b.Create(t, jobstest.Opts{})
	ch, _ := b.connected(t, job.ID)
	// The watch ended during the outage (its renewals failed): none is left.
	require.NoError(t, b.Store.Watch(ctx, job.ID, time.Minute))
	_, err := b.Pool.Exec(ctx, `UPDATE job_watches SET expires_at = now() - interval '1 second' WHERE job_id = $1`, job.ID)
	require.NoError(t, err)

	var killed bool
	require.NoError(t, b.Pool.QueryRow(ctx,
		`SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1`, b.appName).Scan(&killed))
	require.True(t, killed)
	require.Equal(t, 1, next(t, ch), "the catch-up: queued")

	_, err = b.Store.Cancel(ctx, job.ID)
	require.NoError(t, err)
	require.Equal(t, 2, next(t, ch), "the transition after the reconnect is announced")
}

// TestListener_CatchUpIsBoundedByALockedRow: a long transaction holds the row of one followed
// job (no deadlock cycle) as the Listener reconnects. The catch-up share-locked every followed
// job's row with no bound: it waited for that transaction, and every notification on the
// connection, for every job, waited behind it. Past CatchUpLockTimeout it runs again without
// waiting: the locked job is signalled 0 (its subscriber reads for itself), every other job its
// latest event with its watch renewed, and the notifications flow again.
func TestListener_CatchUpIsBoundedByALockedRow(t *testing.T) {
	t.Parallel()
	b := setupListener(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	locked, free := b.Create(t, jobstest.Opts{}), b.Create(t, jobstest.Opts{})
	lockedCh, _ := b.connected(t, locked.ID)
	freeCh, _ := b.connected(t, free.ID)
	other, _ := b.connected(t, "job-a")

	holder, err := b.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = holder.Rollback(context.Background()) }()
	_, err = holder.Exec(ctx, `SELECT 1 FROM jobs WHERE id = $1 FOR UPDATE`, locked.ID)
	require.NoError(t, err)

	var killed bool
	require.NoError(t, b.Pool.QueryRow(ctx,
		`SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1`, b.appName).Scan(&killed))
	require.True(t, killed)

	// The bound is 2 s; the deadline is short, so that the unbounded wait fails here.
	within := func(ch <-chan int, what string) int {
		t.Helper()
		return nextWithin(t, ch, 6*time.Second, what+" (the catch-up waits for the locked row)")
	}
	require.Equal(t, 1, within(freeCh, "the free job"), "the free job's latest event: queued")
	require.Equal(t, 0, within(lockedCh, "the locked job"), "the locked job: read for yourself")
	require.Equal(t, 0, within(other, "no job"))
	b.notify(t, "job-a:4")
	require.Equal(t, 4, within(other, "a notification after the catch-up"))

	var watched bool
	require.NoError(t, b.Pool.QueryRow(ctx,
		`SELECT expires_at > now() FROM job_watches WHERE job_id = $1`, free.ID).Scan(&watched))
	require.True(t, watched, "the free job's watch is renewed")
	_, err = b.Store.Cancel(ctx, free.ID)
	require.NoError(t, err)
	require.Equal(t, 2, within(freeCh, "the free job's transition"), "announced")
}

// TestListener_SilentCatchUpIsReplaced: a connection that goes silent while the catch-up after
// LISTEN waits for its answer (here: the answer held up by a row lock, then the connection
// frozen) is given up at CatchUpLockTimeout + PingInterval, and the Listener listens on a new
// one, whose catch-up reaches the subscribers and after which notifications do. Without a
// deadline on the catch-up, the Listener waited on the silent connection for good (the ping
// runs only after the catch-up).
func TestListener_SilentCatchUpIsReplaced(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	b := jobstest.New(t)
	job := b.Create(t, jobstest.Opts{})
	proxy, viaProxy := pgtest.NewProxy(t, b.URL)
	cfg, err := pgx.ParseConfig(viaProxy)
	require.NoError(t, err)
	l := jobs.NewListener(jobs.ListenerConfig{ConnConfig: cfg, ReconnectDelay: 10 * time.Millisecond,
		PingInterval: 200 * time.Millisecond, CatchUpLockTimeout: 3 * time.Second})

	holder, err := b.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = holder.Rollback(context.Background()) }()
	_, err = holder.Exec(ctx, `SELECT 1 FROM jobs WHERE id = $1 FOR UPDATE`, job.ID)
	require.NoError(t, err)

	ch, unsubscribe := l.Subscribe(job.ID)
	defer unsubscribe()
	runCtx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- l.Run(runCtx) }()
	t.Cleanup(func() {
		stop()
		require.NoError(t, <-done)
	})

	waitForLockWaiter(ctx, t, b.Pool, "FOR SHARE", "the catch-up")
	proxy.Freeze()                           // the catch-up's answer will never come through
	require.NoError(t, holder.Rollback(ctx)) // Postgres answers the frozen connection

	// 0 as the silent catch-up is given up, or the new one's 1 (merged as 0 if not taken).
	nextWithin(t, ch, 15*time.Second, "the Listener waits on the silent catch-up")
	_, err = b.Store.Cancel(ctx, job.ID)
	require.NoError(t, err)
	for v := nextAnnounced(t, ch); v != 2; v = nextAnnounced(t, ch) {
		require.Equal(t, 1, v, "the new catch-up's: queued")
	}
}

// TestListener_SignalsAnEndedJobsLateAttempt: an answer that comes after its job ended (a cancel
// overtook the call) records its attempt, and its usage as the job's, with no event: a live page
// of the job (the console's) saw neither until its next keep-alive (15 s). The write announces
// the watched job with 0 now ("read the job again"), without an event row.
func TestListener_SignalsAnEndedJobsLateAttempt(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	b := setupListener(t)
	job, finish := canceledInFlight(ctx, t, b.Bundle)
	ch, _ := b.connected(t, job.ID)

	// An attempt alone (no usage counted).
	finish(1, jobs.Outcome{Status: jobs.StatusRetrying, LastError: &jobs.LastError{Class: "retryable", Status: 503}})
	require.Equal(t, 0, next(t, ch), "the attempt recorded: read the job again")
	// An answer with its usage, kept as the job's.
	usage := json.RawMessage(`{"input_tokens":7,"output_tokens":9}`)
	finish(2, jobs.Outcome{Status: jobs.StatusSucceeded, Result: json.RawMessage(`{"x":1}`), Usage: usage})
	require.Equal(t, 0, next(t, ch), "the usage kept: read the job again")
	got, err := b.Store.Get(ctx, job.ID)
	require.NoError(t, err)
	require.JSONEq(t, string(usage), string(got.Usage))
	require.Equal(t, []jobs.Status{"queued", "running", "canceled"}, b.Events(t, job.ID), "no event row")
}

// TestStore_LateAttemptIsNotAnnouncedOnTheEventsChannel: the announcement of an ended job's late
// attempt went on EventsChannel as "<id>:0", which a Listener of the last release (fd92bd7)
// refuses, logging a warning per notification, unthrottled, on every API replica for the whole
// of a rollout (a bulk cancel of streamed jobs in flight: one line per job and replica). It
// goes on ChangesChannel now, which no such listener LISTENs on. The raw connection here stands
// for one: the first notification it gets after the late attempt is the test's own marker.
func TestStore_LateAttemptIsNotAnnouncedOnTheEventsChannel(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	b := jobstest.New(t)
	_, finish := canceledInFlight(ctx, t, b)
	old, err := pgx.Connect(ctx, b.URL)
	require.NoError(t, err)
	defer func() { _ = old.Close(context.Background()) }()
	_, err = old.Exec(ctx, "LISTEN "+pgx.Identifier{jobs.EventsChannel}.Sanitize())
	require.NoError(t, err)

	finish(1, jobs.Outcome{Status: jobs.StatusSucceeded, Result: json.RawMessage(`{"x":1}`), Usage: json.RawMessage(`{"input_tokens":1}`)})
	// Notifications are delivered in commit order: the marker comes after anything Finish sent.
	_, err = b.Pool.Exec(ctx, `SELECT pg_notify($1, 'marker')`, jobs.EventsChannel)
	require.NoError(t, err)
	n, err := old.WaitForNotification(ctx)
	require.NoError(t, err)
	require.Equal(t, "marker", n.Payload, "a late attempt announced where a listener of the last release reads")
}

// canceledInFlight creates a job, begins its attempt, cancels it, and watches it (a live page's
// watch): finish then records the answer of its attempt n, which comes late (not applied).
func canceledInFlight(ctx context.Context, t *testing.T, b *jobstest.Bundle) (job *jobs.Job, finish func(n int, o jobs.Outcome)) {
	t.Helper()
	job = b.Create(t, jobstest.Opts{})
	begun, err := b.Store.BeginAttempt(ctx, job.ID)
	require.NoError(t, err)
	_, err = b.Store.Cancel(ctx, job.ID)
	require.NoError(t, err)
	require.NoError(t, b.Store.Watch(ctx, job.ID, time.Minute))
	return job, func(n int, o jobs.Outcome) {
		t.Helper()
		applied, err := b.Store.Finish(ctx, job.ID, &jobs.Attempt{Number: n, Credential: "default", StartedAt: time.Now(),
			Class: "ok", StatusCode: 200, LeaseToken: *begun.LeaseToken}, o)
		require.NoError(t, err)
		require.False(t, applied)
	}
}

// terminate ends the listener's connection (as an outage would): it reconnects and catches up.
func (b *listenerBundle) terminate(ctx context.Context, t *testing.T) {
	t.Helper()
	var killed bool
	require.NoError(t, b.Pool.QueryRow(ctx,
		`SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1`, b.appName).Scan(&killed))
	require.True(t, killed)
}

// TestStore_ADeleteAnnouncesItsWatchedJobs: a delete of jobs (the console's purge of a selection,
// ctl's purge by age; retention and a tenant's deletion end with the same statement) announces
// each deleted job that is watched on ChangesChannel, its ID the payload (what a Listener of the
// last release reads there: "read the job again"), and no job that is not watched. A purge
// announced nothing: a console page of a purged dead letter learned it at its next keep-alive.
// Notifications are delivered in commit order: the test's marker follows what a purge sent.
func TestStore_ADeleteAnnouncesItsWatchedJobs(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		purge func(ctx context.Context, s *jobs.Store, ids []string) error
	}{
		{"Selection", func(ctx context.Context, s *jobs.Store, ids []string) error {
			_, err := s.PurgeDeadIDs(ctx, ids)
			return err
		}},
		{"ByAge", func(ctx context.Context, s *jobs.Store, _ []string) error {
			_, err := s.PurgeDead(ctx, time.Now().Add(time.Hour), nil)
			return err
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			b := jobstest.New(t)
			var ids []string
			for range 3 {
				job := b.Create(t, jobstest.Opts{})
				b.Attempt(t, job.ID, jobs.Outcome{Status: jobs.StatusDead, DeadReason: jobs.ReasonRetriesExhausted})
				ids = append(ids, job.ID)
			}
			require.NoError(t, b.Store.Watch(ctx, ids[0], time.Minute))
			require.NoError(t, b.Store.Watch(ctx, ids[2], time.Minute))
			conn, err := pgx.Connect(ctx, b.URL)
			require.NoError(t, err)
			defer func() { _ = conn.Close(context.Background()) }()
			_, err = conn.Exec(ctx, "LISTEN "+pgx.Identifier{jobs.ChangesChannel}.Sanitize())
			require.NoError(t, err)

			require.NoError(t, tc.purge(ctx, b.Store, ids))
			_, err = b.Pool.Exec(ctx, `SELECT pg_notify($1, 'marker')`, jobs.ChangesChannel)
			require.NoError(t, err)
			var got []string
			for {
				n, err := conn.WaitForNotification(ctx)
				require.NoError(t, err)
				if n.Payload == "marker" {
					break
				}
				got = append(got, n.Payload)
			}
			require.ElementsMatch(t, []string{ids[0], ids[2]}, got, "the watched jobs deleted, each once")
			_, err = b.Store.Get(ctx, ids[1])
			require.ErrorIs(t, err, jobs.ErrNotFound, "the job not watched deleted too")
		})
	}
}
