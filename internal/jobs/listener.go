package jobs

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

// ListenerConfig configures a Listener.
type ListenerConfig struct {
	// ConnConfig is where to LISTEN. The Listener opens its own connection with it (a pooled
	// connection cannot hold a LISTEN). Required.
	ConnConfig *pgx.ConnConfig
	// Logger receives connection losses. Default discards.
	Logger *slog.Logger
	// ReconnectDelay is the first wait before reconnecting after the connection fails; it doubles
	// up to MaxReconnectDelay and resets once a connection is listening. Default 100ms.
	ReconnectDelay time.Duration
	// MaxReconnectDelay caps ReconnectDelay's doubling. Default 5s.
	MaxReconnectDelay time.Duration
	// PingInterval is how long the connection may stay quiet before the Listener pings it, and
	// how long that ping may take: a ping that fails or is not answered in time ends the
	// connection, and the Listener reconnects. A connection that went silent without an error
	// (a partition, a failover behind a moved address) is so replaced within two intervals;
	// no TCP setting finds it sooner than minutes. Default DefaultListenerPingInterval.
	PingInterval time.Duration
	// WatchTTL is how long the watch (Store.Watch) of each subscribed job lasts that the
	// catch-up after every (re)connection renews: the subscribers' own watch TTL (an event
	// stream's is 4 keep-alives). Default DefaultListenerWatchTTL.
	WatchTTL time.Duration
	// CatchUpLockTimeout bounds how long the catch-up after a (re)connection waits for the row
	// lock of a subscribed job that another transaction holds (the lock_timeout of its
	// statement; a shorter one the session has is kept), once for the whole catch-up: past it
	// the catch-up runs again, and on, without waiting for any job's row lock, and the jobs whose
	// rows it skips are signalled 0 (see catchUp).
	// Meanwhile the Listener reads no notification. Default DefaultListenerCatchUpLockTimeout.
	CatchUpLockTimeout time.Duration
	// ChannelFuncs are further NOTIFY channels the Listener LISTENs on, each with the function
	// it hands their notifications' payloads to, in its own goroutine (it must not block), in
	// the order they come. A notification sent while the connection was down is lost: nothing
	// catches it up. Default none.
	ChannelFuncs map[string]func(payload string)
}

// DefaultListenerCatchUpLockTimeout is ListenerConfig.CatchUpLockTimeout's default: a transition
// holds its job's row for a few short round trips, so a longer hold is a stalled session or an
// operator's open transaction (the worker's batches give up on a row lock after as long); above
// Postgres's default deadlock_timeout (1 s), so that a cycle is broken by its check first.
const DefaultListenerCatchUpLockTimeout = 2 * time.Second

// DefaultListenerWatchTTL is ListenerConfig.WatchTTL's default: an event stream's watch at the
// default keep-alive (4 × 15 s).
const DefaultListenerWatchTTL = time.Minute

// DefaultListenerPingInterval is ListenerConfig.PingInterval's default: a silent connection is
// replaced within 20 s, about when an event stream's keep-alive re-read (15 s) would have caught
// up on the transitions it missed anyway; a ping every 10 s of quiet is nothing to Postgres.
const DefaultListenerPingInterval = 10 * time.Second

// Listener fans the job transitions announced on EventsChannel (and the changes without an event
// announced on ChangesChannel) out to in-process subscribers (the SSE streams of one API process)
// over a single Postgres connection, however many subscribers there are. Because the notifications
// come from Postgres, it sees transitions made by any process: workers, other API replicas, ctl.
//
// Notifications are lost while the connection is down; after every (re)connection each
// subscribed job's watch is renewed (WatchTTL) and each subscriber signalled with its job's
// latest event's number as the renewal found it, for every subscribed job together (one
// statement per catchUpPage jobs), so that a subscriber that has read that far
// reads nothing, and one whose job moved meanwhile re-reads the job's events from the table and
// misses nothing, and every later transition is announced: the watches of an outage longer
// than a watch, whose renewals all failed, had ended, and the first transition after the
// reconnect reached its streams a keep-alive late. A reconnect used to signal 0 to every subscriber, and each event stream then
// read the job's events and the job: a herd of two reads per stream on a Postgres just back.
// The zero value is not usable; use NewListener. Safe for concurrent use.
type Listener struct {
	cfg ListenerConfig

	mu   sync.Mutex
	subs map[string]map[chan int]struct{}
	n    int

	page int // jobs a statement of catchUp reads: catchUpPage
}

// NewListener returns a Listener; call Run to start it. It panics without ConnConfig (a wiring bug).
func NewListener(cfg ListenerConfig) *Listener {
	if cfg.ConnConfig == nil {
		panic("jobs.NewListener: ConnConfig is required")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.ReconnectDelay == 0 {
		cfg.ReconnectDelay = 100 * time.Millisecond
	}
	if cfg.MaxReconnectDelay == 0 {
		cfg.MaxReconnectDelay = 5 * time.Second
	}
	if cfg.PingInterval <= 0 {
		cfg.PingInterval = DefaultListenerPingInterval
	}
	if cfg.WatchTTL <= 0 {
		cfg.WatchTTL = DefaultListenerWatchTTL
	}
	if cfg.CatchUpLockTimeout <= 0 {
		cfg.CatchUpLockTimeout = DefaultListenerCatchUpLockTimeout
	}
	return &Listener{cfg: cfg, subs: map[string]map[chan int]struct{}{}, page: catchUpPage}
}

// Subscribe registers interest in one job's transitions. The channel receives the sequence number
// of a transition that committed; after the listener (re)connected, the number of the job's latest
// event (every event up to it is committed, every later one is announced), or 0 when that is
// unknown (the job not found, its row locked past CatchUpLockTimeout, or the read failed); 0 too
// when the job changed without an event (an attempt of an ended job recorded, and its usage kept:
// see Store.Finish; announced on ChangesChannel). Signals coalesce: the channel holds one, the
// highest sent since the last receive, or 0 when any of them was 0. So a value v > 0 means: every
// event up to v is committed, and none past v was signalled since the last receive. A subscriber
// that has read the job's events up to v or beyond has nothing to read; otherwise (or on 0) it
// re-reads the job's events after the last one handled. Subscribe before the first read so that
// nothing committed after that read goes unsignalled. cancel unsubscribes; it is idempotent and
// must be called (the channel is never closed).
func (l *Listener) Subscribe(jobID string) (<-chan int, func()) {
	ch := make(chan int, 1)
	l.mu.Lock()
	set := l.subs[jobID]
	if set == nil {
		set = map[chan int]struct{}{}
		l.subs[jobID] = set
	}
	set[ch] = struct{}{}
	l.n++
	l.mu.Unlock()
	var once sync.Once
	return ch, func() {
		once.Do(func() {
			l.mu.Lock()
			defer l.mu.Unlock()
			delete(set, ch)
			if len(set) == 0 {
				delete(l.subs, jobID)
			}
			l.n--
		})
	}
}

// Subscribers returns the number of live subscriptions.
func (l *Listener) Subscribers() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.n
}

// Run listens until ctx ends, reconnecting with backoff whenever the connection fails or does
// not answer a ping (PingInterval), and returns nil then. Run it once per Listener.
func (l *Listener) Run(ctx context.Context) error {
	delay := l.cfg.ReconnectDelay
	for {
		listened, err := l.listen(ctx)
		if ctx.Err() != nil {
			return nil
		}
		if listened {
			delay = l.cfg.ReconnectDelay
		}
		l.cfg.Logger.WarnContext(ctx, "job event listener disconnected; reconnecting", "error", err, "delay", delay)
		timer := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			timer.Stop()
			return nil
		case <-timer.C:
		}
		delay = min(2*delay, l.cfg.MaxReconnectDelay)
	}
}

// listen runs one connection until it fails or ctx ends. listened reports whether LISTEN took
// effect (so the backoff resets).
func (l *Listener) listen(ctx context.Context) (listened bool, err error) {
	conn, err := pgx.ConnectConfig(ctx, l.cfg.ConnConfig)
	if err != nil {
		return false, fmt.Errorf("connect: %w", err)
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = conn.Close(cctx)
	}()
	channels := append([]string{EventsChannel, ChangesChannel}, slices.Sorted(maps.Keys(l.cfg.ChannelFuncs))...)
	for _, channel := range channels {
		if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{channel}.Sanitize()); err != nil {
			return false, fmt.Errorf("listen: %w", err)
		}
	}
	// Everything committed from now on is announced to us; whatever committed while we were not
	// listening is recovered by the subscribers' re-read, when their job moved past them.
	l.catchUp(ctx, conn)
	for {
		// A wait's deadline leaves the connection usable (pgconn closes it on other errors
		// only): a quiet spell is followed by a ping, which a silent connection fails.
		wctx, cancel := context.WithTimeout(ctx, l.cfg.PingInterval)
		n, err := conn.WaitForNotification(wctx)
		quiet := err != nil && wctx.Err() != nil && ctx.Err() == nil
		cancel()
		if quiet {
			pctx, cancel := context.WithTimeout(ctx, l.cfg.PingInterval)
			err := conn.Ping(pctx)
			cancel()
			if err != nil {
				return true, fmt.Errorf("ping after %s without a notification: %w", l.cfg.PingInterval, err)
			}
			continue
		}
		if err != nil {
			return true, fmt.Errorf("wait for notification: %w", err)
		}
		if n.Channel == ChangesChannel {
			l.signal(n.Payload, 0) // the job changed without an event: its subscribers read it again
			continue
		}
		if f := l.cfg.ChannelFuncs[n.Channel]; f != nil {
			f(n.Payload)
			continue
		}
		id, seq, ok := parseNotification(n.Payload)
		if !ok {
			l.cfg.Logger.WarnContext(ctx, "malformed job event notification", "payload", n.Payload)
			continue
		}
		l.signal(id, seq)
	}
}

// parseNotification splits "<job id>:<seq>".
func parseNotification(payload string) (id string, seq int, ok bool) {
	id, s, found := strings.Cut(payload, ":")
	if !found {
		return "", 0, false
	}
	seq, err := strconv.Atoi(s)
	if err != nil || seq <= 0 {
		return "", 0, false
	}
	return id, seq, true
}

func (l *Listener) signal(id string, seq int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for ch := range l.subs[id] {
		send(ch, seq)
	}
}

// catchUpPage is how many jobs' latest event numbers one statement of catchUp reads (tests
// set fewer: SetCatchUpPage).
const catchUpPage = 1000

// catchUpSQL is catchUp's statement: it renews the watches of the jobs $1 for $2 milliseconds
// (greatest: a longer one is kept) and returns their latest events' numbers, as the share locks
// found them (Store.WatchLatest's guarantee: every later event is announced). The rows are
// locked in the order of (finished_at, id), unfinished jobs last: RetryDead's, which locks the
// dead jobs FOR UPDATE in that order; in ID order, two dead jobs followed (a console's page of
// a dead job stays open) that died in the other order than their IDs' deadlocked the two
// (TestListener_CatchUpAndRetryDeadDoNotDeadlock). Share locks, two catch-ups never wait on
// each other. catchUp sends it after lockTimeoutSQL, in the same transaction: a row lock held
// past CatchUpLockTimeout fails it (55P03), and catchUpSkipLockedSQL runs instead.
const catchUpSQL = `
WITH job AS (SELECT id, event_seq FROM jobs WHERE id = ANY($1::uuid[]) ORDER BY finished_at, id FOR SHARE),
watch AS (
	INSERT INTO job_watches (job_id, expires_at)
	SELECT id, clock_timestamp() + $2 * interval '1 millisecond' FROM job ORDER BY id
	ON CONFLICT (job_id) DO UPDATE SET expires_at = greatest(job_watches.expires_at, excluded.expires_at))
SELECT id::text, event_seq FROM job`

// catchUpSkipLockedSQL is catchUpSQL for the jobs whose rows nobody else holds: a row another
// transaction locks in a conflicting mode is left out (SKIP LOCKED), unread and its watch not
// renewed. It waits for no job's row (the watch inserts' foreign-key checks are on rows it
// share-locked itself); a watch's row that another transaction holds (another process's
// renewal, for a moment) it still waits for, within the same lock_timeout: past it the page
// fails, as any failure of its statement does.
var catchUpSkipLockedSQL = strings.Replace(catchUpSQL, "FOR SHARE)", "FOR SHARE SKIP LOCKED)", 1)

// catchUp renews the watch of every subscribed job and signals every subscriber, once the
// connection listens, with the number of its job's latest event, read on conn after LISTEN took
// effect and together with the renewal: every event up to it is committed, every later one is
// announced to us. A job not found (deleted, or an ID that names none) is signalled 0, and every
// subscriber is when the statement fails: it reads for itself (and its keep-alive renews its
// watch). A statement Postgres aborts as a deadlock's victim is run again (retryAborted): a job
// that died between its snapshot and RetryDead's is ordered apart by the two, and a cycle can
// form (TestListener_CatchUpRetriesWhenChosenAsADeadlockVictim).
//
// The catch-up is bounded: a page whose statement waits for a row lock past CatchUpLockTimeout
// (a long transaction holding one of its jobs, no deadlock cycle) runs again with SKIP LOCKED,
// and so does every later page at once, so that the catch-up as a whole waits for a job's row
// lock once at most: each page waited, and a reconnect following many pages of jobs, each
// meeting a lock, read no notification for as many bounds
// (TestListener_CatchUpIsBoundedOnceForAllPages).
// The SKIP LOCKED statement, too, is run again when Postgres aborts it as a deadlock's victim
// (it still waits for a watch's row): it failed the catch-up, and every subscriber was
// signalled 0 (TestListener_CatchUpSkipLockedRetriesWhenChosenAsADeadlockVictim).
// The jobs it skips are signalled 0, their watches not renewed: their subscribers read for
// themselves, and a transition of theirs that the lapsed watch did not announce reaches them at
// their keep-alive's renewal, which waits for the lock as any statement of theirs does. Every
// other job keeps the guarantee above. Without the bound, every notification on the connection
// waited behind the lock, for every subscriber of the process
// (TestListener_CatchUpIsBoundedByALockedRow). Waiting a little first, rather than skipping at
// once, keeps the guarantee for a job whose transition is committing as the catch-up runs.
func (l *Listener) catchUp(ctx context.Context, conn *pgx.Conn) {
	l.mu.Lock()
	ids := make([]string, 0, len(l.subs))
	for id := range l.subs {
		if ValidID(id) {
			ids = append(ids, id)
		}
	}
	l.mu.Unlock()
	latest := make(map[string]int, len(ids))
	query := catchUpSQL
	skipping, skipRead := 0, 0 // the jobs of the pages read with SKIP LOCKED, and how many of them were
	for page := range slices.Chunk(ids, l.page) {
		var read map[string]int // this page's, kept from the try that succeeded alone
		run := func() error {
			return retryAborted(ctx, func() error {
				read = make(map[string]int, len(page))
				return l.readCatchUpPage(ctx, conn, query, page, read)
			})
		}
		err := run()
		if err != nil && query == catchUpSQL && IsLockTimeout(err) && ctx.Err() == nil {
			query = catchUpSkipLockedSQL // this page and every later one: the bound is the catch-up's
			err = run()
		}
		if err != nil {
			if ctx.Err() == nil {
				l.cfg.Logger.WarnContext(ctx, "renew followed jobs' watches and read their latest events; every subscriber re-reads", "jobs", len(ids), "error", err)
			}
			clear(latest) // 0 to everyone
			skipping = 0
			break
		}
		if query == catchUpSkipLockedSQL {
			skipping += len(page)
			skipRead += len(read)
		}
		maps.Copy(latest, read)
	}
	if skipping > 0 {
		l.cfg.Logger.WarnContext(ctx, "followed jobs' rows locked past the bound; their subscribers re-read",
			"lock_timeout", l.cfg.CatchUpLockTimeout, "jobs", skipping, "read", skipRead)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	for id, set := range l.subs {
		for ch := range set {
			send(ch, latest[CanonicalID(id)])
		}
	}
}

// readCatchUpPage runs query (catchUpSQL or catchUpSkipLockedSQL) for the jobs page on conn, under
// CatchUpLockTimeout's lock_timeout for its transaction alone, and records what it read in read.
// Its answer is awaited PingInterval past that bound at most: a connection gone silent after
// LISTEN (a partition: no error ever comes) fails the page, and with it the connection, which
// pgx closes at the deadline, so the Listener connects again; without a deadline it waited on
// the silent connection for good, every notification with it
// (TestListener_SilentCatchUpIsReplaced).
func (l *Listener) readCatchUpPage(ctx context.Context, conn *pgx.Conn, query string, page []string, read map[string]int) error {
	ctx, cancel := context.WithTimeout(ctx, l.cfg.CatchUpLockTimeout+l.cfg.PingInterval)
	defer cancel()
	var b pgx.Batch
	b.Queue(lockTimeoutSQL, lockSetting(l.cfg.CatchUpLockTimeout))
	b.Queue(query, page, l.cfg.WatchTTL.Milliseconds())
	br := conn.SendBatch(ctx, &b)
	_, err := br.Exec()
	if err == nil {
		var id string
		var seq int
		rows, _ := br.Query()
		_, err = pgx.ForEachRow(rows, []any{&id, &seq}, func() error {
			read[id] = seq
			return nil
		})
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	return err
}

// send delivers v, or makes the pending signal the higher of the two, 0 when either is (0 is
// "read": nothing is known of what was missed): a subscriber that takes it reads whatever either
// announced. Only callers holding l.mu send, so the second send cannot find the channel full.
func send(ch chan int, v int) {
	select {
	case ch <- v:
		return
	default:
	}
	select {
	case pending := <-ch:
		if v != 0 && pending != 0 {
			v = max(v, pending)
		} else {
			v = 0
		}
	default: // taken by the subscriber meanwhile
	}
	select {
	case ch <- v:
	default:
	}
}
