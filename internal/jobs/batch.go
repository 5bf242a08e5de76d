package jobs

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/llmq/llmq/internal/pgwait"
)

// Batching limits (see batcher).
const (
	// batchInFlight is how many batches one Store sends at a time. A statement waits for a batch
	// only while this many are out; under that, it goes at once, alone. One is group commit:
	// everything that arrives while a batch is out goes in the next. Fewer transactions is what
	// Postgres's CPU per job follows (throughput bench, llmq only, median of 3: 4 in flight
	// 416 jobs/s and 1.43 ms of Postgres CPU per job, 2: 464–513 and 1.00–1.15, 1: 603 and 0.83).
	// The cost is head-of-line waiting behind a batch that waits on a row lock; every
	// transaction that locks job rows is one short round trip or a few (Cancel, ctl dead
	// retry), so that wait is short, and batchLockTimeout bounds it when a stalled session
	// holds the lock.
	batchInFlight = 1
	// batchMax is the most statements one batch holds.
	batchMax = 64
	// batchTimeout bounds one batch's round trip (the callers wait for at most their own context):
	// its wait for a connection and its statements, whose lock waits batchLockTimeout bounds. Past
	// it the connection may be silent (open, and never answering: a partition, a failover behind
	// a moved address); if another of the pool's is too, the pool is emptied (see abandonSilent).
	// On a slow server the batch fails as unavailable (its callers may try again). It is well
	// under the 30 s a worker keeps trying to record an outcome for, so that a call paid for is
	// recorded on a new connection rather than lost with the silent one.
	batchTimeout = 10 * time.Second
	// batchLockTimeout bounds how long a batch's transaction (or a statement the batcher runs
	// alone) waits for a row lock another session holds: its lock_timeout, set for that
	// transaction only (see lockTimeoutSQL). The batcher's statements touch one job row each and
	// the transactions that lock job rows are a few short round trips, so a longer wait is a
	// lock held by a stalled session (a transaction whose client fell silent keeps its locks
	// until Postgres notices, hours with TCP's keepalive) or an operator's open transaction; with one
	// batch in flight, the wait held every transition of the process for batchTimeout.
	batchLockTimeout = 2 * time.Second
	// silentProbeTimeout bounds the ping that tells a silent pool from a slow server once a
	// statement ran out of its batch's bound (see abandonSilent): an empty statement that even
	// a loaded server answers in milliseconds.
	silentProbeTimeout = 2 * time.Second
)

// lockTimeoutSQL sets the lock_timeout of the transaction it runs in to $1 (batchLockTimeout),
// unless the session's own is shorter (an operator's, from the database URL's options): the
// batcher sends it before its statements, in the same pipeline, so that it ends with their
// transaction and the pool's sessions keep their setting for everything else (a retention
// pass, a migration, the console's lists wait for locks as configured).
const lockTimeoutSQL = `SELECT set_config('lock_timeout', $1, true)
WHERE current_setting('lock_timeout')::interval = interval '0' OR current_setting('lock_timeout')::interval > $1::interval`

// lockTimeoutSetting is batchLockTimeout as lockTimeoutSQL's argument.
var lockTimeoutSetting = lockSetting(batchLockTimeout)

// lockSetting is d as lockTimeoutSQL's argument: whole milliseconds.
func lockSetting(d time.Duration) string { return fmt.Sprintf("%dms", d.Milliseconds()) }

// lockTimeoutArgs are lockTimeoutSQL's arguments, boxed once: pgx only reads a batch's
// arguments.
var lockTimeoutArgs = []any{lockTimeoutSetting}

// IsLockTimeout reports whether err is a statement that waited for a lock past the lock_timeout
// (55P03 lock_not_available), or one run Alone that was not sent because every connection beside
// the batches waits on a locked row already: it took no effect (its transaction rolled back, or
// never began). It is also unavailable (IsUnavailable): the lock's holder may let go soon.
func IsLockTimeout(err error) bool {
	var pgErr *pgconn.PgError
	return (errors.As(err, &pgErr) && pgErr.Code == pgerrLockNotAvailable) || isBesideFull(err)
}

// pgerrLockNotAvailable is SQLSTATE lock_not_available.
const pgerrLockNotAvailable = "55P03"

// batcher sends the hot path's one-statement transitions of concurrent callers (create without an
// idempotency key, get, begin attempt, finish) to Postgres together: a batch is one pipelined
// round trip that runs in one implicit transaction, so it pays for one commit (one WAL flush)
// instead of one per statement. The throughput profile showed Postgres's CPU per job dominated by
// per-statement commits, and every caller's pool connection waiting on the WAL flush.
//
// Nothing is weakened: each caller still returns only after the transaction holding its statement
// committed, and each statement keeps its own conditions. A batch whose transaction fails (one
// statement's error aborts all of them) is run again one statement at a time, so one bad
// statement fails alone; a statement run alone whose connection broke is run again, on another
// connection (see runAlone). A statement that waits for a row lock past batchLockTimeout fails
// (lock_not_available, unavailable to its caller) without holding up the rest: in a batch it
// answers that at once, and only the others run again alone. So every statement the batcher takes must be safe to run again
// after a run whose commit answer was lost (see decisions.md): a create recognises its own row,
// an attempt start its own lease. There is no background goroutine: a statement that finds nothing
// out or waiting runs on its caller's goroutine (runOwn); otherwise the caller that finds fewer
// than batchInFlight batches out starts one, which keeps sending what has queued until nothing has.
type batcher struct {
	pool *pgxpool.Pool

	mu       sync.Mutex
	pending  []*batchOp
	inFlight int

	// idle, when set (by tests, before the batcher's first use), is called each time the batcher
	// has sent everything and stopped.
	idle func()
	// timeout, when set (StoreOpts.BatchTimeout, or by tests before the batcher's first use),
	// replaces batchTimeout.
	timeout time.Duration
	// lockArgs, when set (StoreOpts.LockTimeout), replace lockTimeoutArgs: lockTimeoutSQL's
	// arguments, boxed once per Store.
	lockArgs []any

	// resetMu guards reset, when abandonSilent last emptied the pool.
	resetMu sync.Mutex
	reset   time.Time
	// besideOnce makes beside, the slots of the statements run Alone (a token each held).
	besideOnce sync.Once
	beside     chan struct{}
}

// errBatchTimeout is the cause of a batch's context that ran out of its own bound (batchTimeout).
var errBatchTimeout = errors.New("postgres did not answer the batch in time")

// withBound returns ctx bounded by the batch's time (batchTimeout), ending with errBatchTimeout
// as its cause; or ctx itself when its own deadline comes first (the API's requests, whose
// StoreTimeout is as long and began before), and cancel then does nothing. context would make a
// cancel-only child there, ending with ctx and its cause, which bounds nothing more: its
// context, its Done channel and its cancel were 5 allocations a statement.
func (b *batcher) withBound(ctx context.Context) (context.Context, context.CancelFunc) {
	d := b.bound()
	if deadline, ok := ctx.Deadline(); ok && deadline.Before(time.Now().Add(d)) {
		return ctx, func() {}
	}
	return context.WithTimeoutCause(ctx, d, errBatchTimeout)
}

// abandonSilent empties the pool (pgxpool.Pool.Reset: idle connections are closed now, those in
// use when they come back: a leader's or a pause's session keeps its connection, and its locks,
// until it lets go) when ctx, a batch's, ran out of its own bound, on a connection or waiting
// for one (the pool pings an idle connection before handing it out, with the batch's whole
// time), and a connection the pool holds idle then does not answer a ping within
// silentProbeTimeout. A pool with no connection idle is kept (see below).
// The connection that did not answer is closed by pgx; when one of the pool's connections falls
// silent the others made before it usually have too (they cross the same partition, or lead to
// an address the server has left), and each would cost the process's next batch its whole
// bound, every transition of the process queued behind it, one after the other. A pool whose
// connection answers the ping is a slow server's, which connections made again would load
// more: it is kept. At most one probe per bound: statements that give up together (a batch,
// then each of its statements) do not empty the pool one after the other.
func (b *batcher) abandonSilent(ctx context.Context) {
	if !errors.Is(context.Cause(ctx), errBatchTimeout) {
		return
	}
	pctx, cancel := context.WithTimeout(context.Background(), silentProbeTimeout)
	defer cancel()
	b.resetMu.Lock()
	if !b.reset.IsZero() && time.Since(b.reset) < b.bound() {
		b.resetMu.Unlock()
		return
	}
	// A connection the pool holds idle, taken without waiting: emptying the pool closes the
	// idle ones now. With none (every connection in use), nothing is: one in use that is silent
	// is closed by pgx when its statement gives up, and one that answers would be closed for
	// nothing as it came back. (A probe that waited for a connection in use got none on a full
	// pool of a slow server, and emptied it.) The others taken are given back at once: the
	// process's statements go on on them while the ping waits (up to silentProbeTimeout on a
	// slow server), rather than wait or make connections to it.
	idle := b.pool.AcquireAllIdle(pctx)
	if len(idle) == 0 {
		b.resetMu.Unlock()
		return
	}
	b.reset = time.Now()
	b.resetMu.Unlock()
	for _, c := range idle[1:] {
		c.Release()
	}
	probe := idle[0]
	defer probe.Release()
	if err := probe.Ping(pctx); err != nil {
		b.pool.Reset()
	}
}

// bound is the batch's time: batchTimeout, or the test's.
func (b *batcher) bound() time.Duration {
	if b.timeout > 0 {
		return b.timeout
	}
	return batchTimeout
}

// lockTimeout is lockTimeoutSQL's arguments: batchLockTimeout's, or the Store's own.
func (b *batcher) lockTimeout() []any {
	if b.lockArgs != nil {
		return b.lockArgs
	}
	return lockTimeoutArgs
}

// takeBeside takes one of the slots of the statements run Alone, a quarter of the pool's
// connections (at least one), and returns its release; ok is false when every slot is taken.
func (b *batcher) takeBeside() (release func(), ok bool) {
	b.besideOnce.Do(func() { b.beside = make(chan struct{}, max(1, b.pool.Stat().MaxConns()/4)) })
	select {
	case b.beside <- struct{}{}:
		return func() { <-b.beside }, true
	default:
		return nil, false
	}
}

type aloneKey struct{}

// besideFullError answers a statement run Alone while every slot beside the batches is taken by
// others waiting for locked rows: nothing of it was sent (no server answered it), and it is to
// be tried again later, as a lock wait past its bound is (IsLockTimeout and IsUnavailable take
// it for one). The slots keep the rest of the pool for the batches and everything else however
// many rows stay locked.
type besideFullError struct{}

func (besideFullError) Error() string {
	return "not sent: every connection for statements waiting on locked rows is taken"
}

// isBesideFull reports whether err is a besideFullError.
func isBesideFull(err error) bool { return errors.As(err, new(besideFullError)) }

// Alone returns ctx marking the Store's batched statements run under it (a get, an attempt's
// start, an outcome: see batcher) to go out each in a transaction of its own, on the caller's
// goroutine and a connection of its own, beside the batches instead of in one: for a statement
// tried again after it waited for a row lock past its bound (IsLockTimeout), while the row may
// still be locked. In a batch, each such try held that batch, and every transition of the
// process queued behind it, for the lock's bound (batchLockTimeout); alone it holds one pool
// connection that long. Its lock waits and its time keep their bounds, and a try whose
// connection broke is made again as in a batch. At most a quarter of the pool's connections
// (at least one) run such statements at a time; one that finds them all taken is not sent and
// answers a lock wait past its bound (IsLockTimeout), to be tried again.
func Alone(ctx context.Context) context.Context { return context.WithValue(ctx, aloneKey{}, true) }

// batchOp is one statement and what its caller does with the row it answers with.
type batchOp struct {
	// ctx is the caller's: a statement whose caller gave up before it was sent is not sent.
	ctx context.Context
	// key orders a batch's statements (the job's ID): two batches lock job rows in one order, so
	// they cannot deadlock each other.
	key  string
	sql  string
	args []any
	// scan reads the statement's row. Its error is the caller's answer; pgx.ErrNoRows and
	// ErrNotFound are answers too (a conditional statement that matched nothing), any other
	// error fails the batch's transaction.
	scan rowScan
	err  error
	done chan struct{}
	// expired: its caller's pgwait bound ended while its batch waited for a connection, so it
	// was left out of the batch (see acquireFor).
	expired bool
}

// queryRow runs sql alone or as part of a batch and scans its row with scan, returning scan's
// error (or the batch's, or ctx's if it ends first: the statement may still commit). scan may run
// on the batch's goroutine: what it writes may be read after a nil return only; after ctx's end it
// may still be running.
func (b *batcher) queryRow(ctx context.Context, key, sql string, args []any, scan func(pgx.Row) error) error {
	return b.query(ctx, &batchOp{ctx: ctx, key: key, sql: sql, args: args, scan: scanFunc(scan)})
}

// rowScan reads a statement's row (batchOp.scan). An interface, not a func, so that a caller's
// op may be the scan itself (jobQuery), made in one allocation with what it scans into.
type rowScan interface {
	scanRow(pgx.Row) error
}

// scanFunc is a rowScan of a func.
type scanFunc func(pgx.Row) error

func (f scanFunc) scanRow(r pgx.Row) error { return f(r) }

// query is queryRow of an op made by its caller (its ctx the one query is given).
func (b *batcher) query(ctx context.Context, op *batchOp) error {
	if alone, _ := ctx.Value(aloneKey{}).(bool); alone {
		release, ok := b.takeBeside()
		if !ok {
			return fmt.Errorf("run beside the batches: %w", besideFullError{})
		}
		defer release()
		rctx, cancel := b.withBound(ctx)
		defer cancel()
		if err := b.runAlone(rctx, op); err != nil {
			return cmp.Or(ctx.Err(), err)
		}
		return nil
	}
	b.mu.Lock()
	if b.inFlight < batchInFlight && len(b.pending) == 0 {
		// Nothing is out or waiting: the statement goes at once, alone, from the caller's own
		// goroutine. Handing it to a goroutine of its own, and waking the caller when it is done,
		// cost two goroutine wake-ups per statement, the common case below full throttle.
		b.inFlight++
		b.mu.Unlock()
		return b.runOwn(ctx, op)
	}
	op.done = make(chan struct{})
	b.pending = append(b.pending, op)
	start := b.inFlight < batchInFlight
	if start {
		b.inFlight++
	}
	b.mu.Unlock()
	if start {
		go b.send()
	}
	select {
	case <-op.done:
		return op.err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// runOwn runs op, alone, on its caller's goroutine, within the caller's context: the caller's
// end cancels the statement, which may still commit, as a batched statement's may. What queued
// meanwhile goes to a goroutine that sends it, which takes over op's place in flight.
func (b *batcher) runOwn(ctx context.Context, op *batchOp) error {
	rctx, cancel := b.withBound(ctx)
	err := b.runAlone(rctx, op)
	cancel()
	b.mu.Lock()
	more := len(b.pending) > 0
	if !more {
		b.inFlight--
	}
	b.mu.Unlock()
	if more {
		go b.send()
	} else if b.idle != nil {
		b.idle()
	}
	if err != nil && ctx.Err() != nil {
		return ctx.Err()
	}
	return err
}

// send runs batches of what is pending until nothing is.
func (b *batcher) send() {
	for {
		b.mu.Lock()
		if len(b.pending) == 0 {
			b.inFlight--
			b.mu.Unlock()
			if b.idle != nil {
				b.idle()
			}
			return
		}
		n := min(len(b.pending), batchMax)
		ops := slices.Clone(b.pending[:n])
		b.pending = slices.Delete(b.pending, 0, n)
		b.mu.Unlock()
		b.run(ops)
	}
}

// run executes ops in one transaction, or one by one if that transaction fails, and releases
// their callers. An op whose caller gave up meanwhile is dropped unsent (its error is the
// caller's context's).
func (b *batcher) run(ops []*batchOp) {
	ctx, cancel := b.withBound(context.Background())
	defer cancel()
	send := make([]*batchOp, 0, len(ops))
	for _, op := range ops {
		if err := op.ctx.Err(); err != nil {
			op.err = err
			continue
		}
		send = append(send, op)
	}
	// When every caller bounds its wait for a connection (pgwait.Bound: the API's requests),
	// so does the batch; a batch that includes a caller without a bound (a worker's) waits as
	// that one would, without the callers whose bound ends first (acquireFor).
	var conn *pgxpool.Conn
	if wait, ok := boundedWait(send); ok {
		var unbound context.CancelFunc
		ctx, unbound = pgwait.Bound(ctx, wait)
		defer unbound()
	} else if len(send) > 1 {
		// Callers with a bound and callers without (`llmq serve`: the API's and the worker's):
		// those with one are answered by it if the batch's connection does not come in time.
		conn, send = b.acquireFor(ctx, send)
	}
	switch {
	case len(send) == 1 && conn == nil:
		send[0].err = b.runAlone(ctx, send[0])
	case len(send) > 0 && !b.runTogether(ctx, conn, send):
		// The batch was sent and failed: its commit answer may have been lost, and its statements
		// taken effect. Run again, each waits for a connection without the bound (its caller
		// needs its answer, not a refusal saying nothing was sent); had the bound fired before
		// the batch was sent, ctx is over and they fail at once. A statement that waited for a
		// lock past batchLockTimeout keeps that answer: the batch rolled back with it, so it
		// took no effect, and alone it would wait as long again with the others behind it.
		alone := pgwait.Unbound(ctx)
		for _, op := range send {
			if IsLockTimeout(op.err) {
				continue
			}
			op.err = b.runAlone(alone, op)
		}
	}
	if cause := context.Cause(ctx); errors.Is(cause, pgwait.ErrTimeout) {
		// The bound ended the batch: the statements it stopped learn why (a bare
		// context.Canceled reads as their caller's own); those answered before keep their answer.
		for _, op := range send {
			if errors.Is(op.err, context.Canceled) {
				op.err = fmt.Errorf("batch: %w", cause)
			}
		}
	}
	for _, op := range ops {
		close(op.done)
	}
}

// acquireFor takes a connection for a batch of ops of which some callers have a pgwait bound and
// some none: the wait lasts as long as ctx does, and each op whose bound ends before the
// connection comes is left out of the batch (expired, its caller's context canceled with
// pgwait.ErrTimeout: nothing of it is sent). It returns the connection (nil when none came:
// ops are then run as without it) and the ops left to send.
func (b *batcher) acquireFor(ctx context.Context, ops []*batchOp) (*pgxpool.Conn, []*batchOp) {
	var mu sync.Mutex
	acquired := false
	timers := make([]*time.Timer, 0, len(ops))
	for _, op := range ops {
		wait, ok := pgwait.Wait(op.ctx)
		if !ok {
			continue
		}
		timers = append(timers, time.AfterFunc(wait, func() {
			mu.Lock()
			defer mu.Unlock()
			if !acquired {
				op.expired = pgwait.Expire(op.ctx)
			}
		}))
	}
	conn, err := b.pool.Acquire(ctx)
	mu.Lock()
	acquired = true
	mu.Unlock()
	for _, t := range timers {
		t.Stop()
	}
	send := make([]*batchOp, 0, len(ops))
	for _, op := range ops {
		if op.expired {
			op.err = fmt.Errorf("batch: %w", pgwait.ErrTimeout)
			continue
		}
		send = append(send, op)
	}
	if err != nil {
		return nil, send
	}
	if len(send) == 0 { // not so while a caller without a bound is among ops
		conn.Release()
		return nil, send
	}
	return conn, send
}

// boundedWait is the shortest pgwait bound of ops' callers, and false when one has none.
func boundedWait(ops []*batchOp) (time.Duration, bool) {
	var shortest time.Duration
	for i, op := range ops {
		w, ok := pgwait.Wait(op.ctx)
		if !ok {
			return 0, false
		}
		if i == 0 || w < shortest {
			shortest = w
		}
	}
	return shortest, len(ops) > 0
}

// runAlone runs op in a transaction of its own. When the connection broke under it, the statement
// may have committed without its answer reaching us, or not have reached Postgres at all: it is
// run again, on another connection, unless its caller or the batch's time is gone; and again,
// up to once per connection the pool may hold: after a Postgres restart or failover every idle
// connection of the pool is dead, and the pool hands them out unchecked (it pings only one idle
// for over a second), so a single try more failed a statement on a server that was back. Each
// connection that failed leaves the pool, and the last try dials a new one. Past the first try
// again, one that could not connect at all ends the tries (the server is down, not a
// connection), and so does an error the server answered on a working connection (see brokenConn).
func (b *batcher) runAlone(ctx context.Context, op *batchOp) error {
	err := b.queryAlone(ctx, op)
	for tries := int32(0); ; tries++ {
		if !IsUnavailable(err) || IsLockTimeout(err) || ctx.Err() != nil || op.ctx.Err() != nil {
			return err
		}
		if tries > 0 && (!brokenConn(err) || tries >= b.pool.Stat().MaxConns()) {
			return err
		}
		// The try before may have committed: this one waits for a connection without a
		// pgwait bound (see run).
		err = b.queryAlone(pgwait.Unbound(ctx), op)
	}
}

// aloneBatch is queryAlone's batch, its two statements and their list in one allocation. Queued
// by pgx.Batch.Queue, each statement was 2 allocations (it and the list's growth),
// lockTimeoutSQL's argument 2 (boxed, in a slice of its own) and the batch 1: 7 for a statement
// the batcher runs alone, as every submit's and poll's is below full throttle, 1 now
// (TestBatcher_AloneAllocs).
type aloneBatch struct {
	batch   pgx.Batch
	queries [2]pgx.QueuedQuery
	queued  [2]*pgx.QueuedQuery
}

// queryAlone runs op in a transaction of its own, its lock waits bounded by batchLockTimeout
// (lockTimeoutSQL, in the same round trip), and returns op.scan's error or the statement's.
func (b *batcher) queryAlone(ctx context.Context, op *batchOp) error {
	ab := &aloneBatch{queries: [2]pgx.QueuedQuery{
		{SQL: lockTimeoutSQL, Arguments: b.lockTimeout()},
		{SQL: op.sql, Arguments: op.args},
	}}
	ab.queued = [2]*pgx.QueuedQuery{&ab.queries[0], &ab.queries[1]}
	ab.batch.QueuedQueries = ab.queued[:]
	conn, err := b.pool.Acquire(ctx)
	if err != nil {
		b.abandonSilent(ctx)
		return err
	}
	defer conn.Release()
	br := conn.SendBatch(ctx, &ab.batch)
	if _, err := br.Exec(); err != nil {
		_ = br.Close()
		b.abandonSilent(ctx)
		return err
	}
	err = op.scan.scanRow(br.QueryRow())
	answered := err == nil || errors.Is(err, pgx.ErrNoRows) || errors.Is(err, ErrNotFound)
	if cerr := br.Close(); cerr != nil && answered {
		return cerr // the answer stands only once its transaction committed
	}
	return err
}

// brokenConn reports whether err is a connection that broke (or was dead already) under a
// statement, so that the statement may run on another; not a failure to connect, nor an error
// the server answered on a connection that works (a statement it canceled, 57014, for a
// statement_timeout or an operator's cancel; out of memory or disk, class 53): run once per
// connection the pool may hold, such a statement would wait that many statement_timeouts with
// the store's other statements queued behind it, and multiply the load of a server that cancels
// statements because it is overloaded. A server shutting down (57P01-57P03) ends the connection.
func brokenConn(err error) bool {
	var connectErr *pgconn.ConnectError
	if !IsUnavailable(err) || errors.As(err, &connectErr) {
		return false
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return strings.HasPrefix(pgErr.Code, "08") || strings.HasPrefix(pgErr.Code, "57P")
	}
	return true
}

// errBatchAborted is the error of a batch's statement that did not run: an earlier one failed
// the batch. run runs it again alone.
var errBatchAborted = errors.New("batch aborted by an earlier statement")

// runTogether sends ops as one batch (one implicit transaction), on conn when one was acquired
// for it (released here), and reports whether it committed; on false, nothing of it took effect
// and the ops' errors are to be overwritten.
func (b *batcher) runTogether(ctx context.Context, conn *pgxpool.Conn, ops []*batchOp) bool {
	slices.SortStableFunc(ops, func(x, y *batchOp) int { return cmp.Compare(x.key, y.key) })
	var batch pgx.Batch
	batch.Queue(lockTimeoutSQL, b.lockTimeout()...)
	for _, op := range ops {
		batch.Queue(op.sql, op.args...)
	}
	if conn == nil {
		var err error
		if conn, err = b.pool.Acquire(ctx); err != nil {
			b.abandonSilent(ctx)
			return false // the ops' errors are overwritten
		}
	}
	defer conn.Release()
	br := conn.SendBatch(ctx, &batch)
	_, err := br.Exec()
	failed := err != nil
	if failed {
		b.abandonSilent(ctx)
	}
	for _, op := range ops {
		if failed {
			// Postgres skips the rest of a failed pipeline (pgx repeats the first error for it):
			// these statements were not run, whatever the error that stopped the batch.
			op.err = errBatchAborted
			continue
		}
		op.err = op.scan.scanRow(br.QueryRow())
		if op.err != nil && !errors.Is(op.err, pgx.ErrNoRows) && !errors.Is(op.err, ErrNotFound) {
			failed = true
		}
	}
	if err := br.Close(); err != nil {
		failed = true
	}
	return !failed
}
