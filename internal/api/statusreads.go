package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/llmq/llmq/internal/jobs"
	"github.com/llmq/llmq/internal/pgwait"
)

// statusReads shares the reads of a job's status events and of the job among the event streams
// that follow it on this replica. A transition wakes every stream of the job at once; each read
// both for itself before, so 1,000 followers of one job cost Postgres 2,000 statements per
// transition. Now at most one read of a job runs at a time, and a stream takes the first read
// that is sure to hold what it was woken for:
//   - a read that began after the stream asked (it sees every event committed before the stream
//     was woken): the read out, when the stream asks while none is, else the next one, which
//     starts when the read out ends and serves every stream that asked meanwhile;
//   - a read, out or done (the last one is kept while several streams follow the job), that
//     holds the event the stream was told of (need, the number a notification or a watch
//     announced: every event up to it is committed, and a read holding it holds them all,
//     events numbered without gaps in commit order).
//
// A read that began before the stream was woken is never taken for one that did not find the
// event announced: it may have missed it. So the ordering and the no-gap guarantees of a stream
// are those of its own reads: a read takes the events after the lowest position of the streams
// it serves, and each stream keeps those after its own.
//
// A read is the server's, not one stream's: its context is none of the streams' (a client
// gone does not fail the others' read), bounded by StoreWait for a pool connection and by
// StoreTimeout in all. The reads of different jobs take turns: at most a few run at once
// (turns, a quarter of the pool), the others wait for a turn with no bound, and a read's bounds
// count from its turn. A read whose streams all left (their clients gone) while it waited is not
// made, and one running is cancelled: it read the job's events and maybe a large answer for no
// one until its bound. A stream that asks then does not join it (it takes the next read): no
// stream gets a read cancelled, and none that a stream waits for is. Jobs that end together (500
// streams of 500 jobs with 800 kB answers) all wake their streams at once: their reads, each
// with its own bounds, all asked the pool for a connection at once before, and those queued
// behind the first few spent their bounds in the queue (141 of those 500 streams ended on "the
// job store did not answer in time").
//
// It shares the streams' watch renewals of a job too (renew): one made within half a keep-alive
// serves every stream of the job but the one whose renewal it was. The renewals of different jobs
// take turns as the reads do, turns of their own (as many): streams opened together keep their
// keep-alives together, and 5,000 of them renewing at once held a pool of 16 for 2 s, a poll's
// statement waiting up to 2 s for a connection. It is safe for concurrent use.
type statusReads struct {
	store *jobs.Store
	// wait and timeout bound a read (Config.StoreWait, Config.StoreTimeout).
	wait, timeout time.Duration
	// watchTTL is the TTL a renewal gives the job's watch; fresh, how old a renewal may be for
	// a stream to take it instead of making one (half a keep-alive); now, the clock of both.
	watchTTL, fresh time.Duration
	now             func() time.Time
	// turns holds a token for each read running: its capacity is how many run at once.
	turns chan struct{}
	// renewTurns holds a token for each watch renewal running: as many as turns, apart, so that
	// a renewal (one short statement) never waits behind the reads of large answers.
	renewTurns chan struct{}
	// metrics counts the reads waiting for a turn (nil: none).
	metrics *Metrics

	mu   sync.Mutex
	jobs map[string]*jobReads
}

// newStatusReads returns the shared reads of store's jobs: at most turns at once (at least 1),
// and as many renewals, each bounded by wait for a pool connection and by timeout in all from
// its turn; keepAlive is the streams' keep-alive interval, whose watch renewals give the watch a
// TTL of 4 keep-alives and are shared for half a keep-alive (renew).
func newStatusReads(store *jobs.Store, turns int, wait, timeout, keepAlive time.Duration, now func() time.Time, metrics *Metrics) *statusReads {
	return &statusReads{store: store, wait: wait, timeout: timeout, watchTTL: 4 * keepAlive, fresh: keepAlive / 2,
		now: now, jobs: map[string]*jobReads{}, turns: make(chan struct{}, max(1, turns)),
		renewTurns: make(chan struct{}, max(1, turns)), metrics: metrics}
}

// statusReadTurns is how many shared reads of the streams run at once on a pool of maxConns
// connections (0: no pool known): a quarter of them, at least 1, so that reads of large answers
// leave the rest to submits, polls and the streams' openings.
func statusReadTurns(maxConns int) int {
	if maxConns <= 0 {
		return 4
	}
	return max(1, maxConns/4)
}

// jobReads is the reads of one job.
type jobReads struct {
	// streams is how many streams follow the job (follow): the job's entry, and its last read,
	// are kept as long as one does.
	streams int
	// started numbers the reads begun, in order (statusRead.no).
	started int
	// out is the read running (nil: none); next, the read that starts when it ends, which
	// streams that ask meanwhile join (nil: none asked).
	out, next *sharedRead
	// last is the newest read that succeeded, kept while more than one stream follows the job
	// (a job of one stream, the common case, holds no job in memory between its reads), or
	// while one does when it holds the job ended (sharedRead.final).
	last *sharedRead
	// renewing is the watch renewal running (nil: none); renewed, the newest that succeeded.
	renewing, renewed *watchRenewal
}

// watchRenewal is one renewal of a job's watch (jobs.Store.WatchLatest), shared by its streams.
type watchRenewal struct {
	// at is when it began: the watch lasts at least its TTL from then.
	at   time.Time
	done chan struct{}
	// Set before done is closed: the job's latest event's number as the watch found it.
	seq int
	err error
}

// sharedRead is one read of a job's status events after a sequence number, and of the job.
type sharedRead struct {
	// after is the sequence number the events are read after: the lowest of the streams it
	// serves (fixed once it starts).
	after int
	// no is its place among the job's reads (0: not started).
	no int
	// joined is how many streams wait for it: a read none waits for is not made (run), or is
	// cancelled (read).
	joined int
	// cancel, set when it runs, cancels its statements with the cause errReadAbandoned;
	// cancelled, set when read calls it, keeps streams from joining it.
	cancel    context.CancelCauseFunc
	cancelled bool
	done      chan struct{}
	// Set before done is closed.
	evs []jobs.Event
	job *jobs.Job
	err error
	// upTo is the newest event it holds (after, with none).
	upTo int
	// data holds each event's encoding (eventData), made once for all the streams.
	data []eventEncoding
}

// eventEncoding is the data of an SSE status event, made at its first use.
type eventEncoding struct {
	once sync.Once
	b    []byte
	err  error
}

// follow registers a stream of the job; call release once when it ends.
func (sr *statusReads) follow(id string) (release func()) {
	sr.mu.Lock()
	e := sr.jobs[id]
	if e == nil {
		e = &jobReads{}
		sr.jobs[id] = e
	}
	e.streams++
	sr.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			sr.mu.Lock()
			defer sr.mu.Unlock()
			if e.streams--; e.streams < 2 && !e.last.final() {
				e.last = nil
			}
			sr.forgetLocked(id, e)
		})
	}
}

// forgetLocked drops the job's entry once no stream follows it and no read of it is out.
func (sr *statusReads) forgetLocked(id string, e *jobReads) {
	if e.streams == 0 && e.out == nil && e.next == nil && e.renewing == nil {
		delete(sr.jobs, id)
	}
}

// read returns the job's status events after after, and the job (at least as new as them), for a
// stream of the job (follow) woken now. need > 0 is the number of an event the stream knows is
// committed, every event up to it with it (a notification's, a watch's): a read holding it
// serves, whenever it began; need 0 takes a read that begins after this call. The events
// returned and the job are shared: the caller must not modify them. It returns ctx's error if
// ctx ends first.
func (sr *statusReads) read(ctx context.Context, id string, after, need int) (*statusRead, error) {
	sr.mu.Lock()
	e := sr.jobs[id]
	if e == nil { // a caller that does not follow the job: an entry for this read only
		e = &jobReads{}
		sr.jobs[id] = e
	}
	asked := e.started // reads numbered above began after this call
	if l := e.last; need > 0 && l != nil && l.after <= after && l.upTo >= need {
		sr.mu.Unlock()
		return l.result(after), nil
	}
	for {
		var rd *sharedRead
		if o := e.out; o != nil && !o.cancelled && o.after <= after && (o.no > asked || need > 0) {
			rd = o // began after the call, or may hold the event announced
		} else {
			if e.next == nil {
				e.next = &sharedRead{after: after, done: make(chan struct{})}
			}
			rd = e.next
			rd.after = min(rd.after, after)
			if e.out == nil {
				sr.startLocked(id, e)
			}
		}
		rd.joined++
		sr.mu.Unlock()
		select {
		case <-rd.done:
		case <-ctx.Done():
			sr.mu.Lock()
			if rd.joined--; rd.joined == 0 && rd == e.out && rd.cancel != nil {
				// Running, and every stream it serves left: no stream joins it now.
				rd.cancelled = true
				rd.cancel(errReadAbandoned)
			}
			sr.mu.Unlock()
			return nil, ctx.Err()
		}
		sr.mu.Lock()
		rd.joined--
		if rd.no > asked || rd.err == nil && need > 0 && rd.upTo >= need {
			sr.mu.Unlock()
			if rd.err != nil {
				return nil, rd.err
			}
			return rd.result(after), nil
		}
		// A read that began before the call and did not hold the event: the next one will.
	}
}

// startLocked starts the job's next read.
func (sr *statusReads) startLocked(id string, e *jobReads) {
	rd := e.next
	e.next, e.out = nil, rd
	e.started++
	rd.no = e.started
	go sr.run(id, e, rd)
}

// run reads the job's status events and the job for rd once it has a turn (statusReads), then
// starts the next read if a stream asked for one meanwhile.
func (sr *statusReads) run(id string, e *jobReads, rd *sharedRead) {
	select {
	case sr.turns <- struct{}{}:
	default: // all taken: wait, counted (llmq_event_stream_reads_waiting)
		sr.metrics.streamReadWaits(1)
		sr.turns <- struct{}{} // waiting goroutines are served in order
		sr.metrics.streamReadWaits(-1)
	}
	defer func() { <-sr.turns }()
	sr.mu.Lock()
	if rd.joined == 0 {
		// Every stream that asked for it left while it waited for its turn (their clients
		// gone): it is not made, and no stream can join it now (it ends under this lock).
		sr.endLocked(id, e, rd, nil, nil, errReadAbandoned)
		sr.mu.Unlock()
		return
	}
	ctx, cancel := sr.bounded()
	defer cancel()
	ctx, rd.cancel = context.WithCancelCause(ctx)
	sr.mu.Unlock()
	evs, err := sr.store.Events(ctx, id, rd.after)
	var job *jobs.Job
	if err == nil {
		// No event carries the request (it is not part of the job JSON), and the read may be
		// kept (last) for as long as the job's streams follow it: it is not read at all (up to
		// api.max_body_bytes from Postgres at every transition).
		job, err = sr.store.GetWithoutRequest(ctx, id)
	}
	if err != nil && ctx.Err() != nil {
		err = fmt.Errorf("read job events: %w", context.Cause(ctx))
		if errors.Is(err, errReadAbandoned) {
			err = errReadAbandoned // cancelled: every stream it served left
		}
	}
	sr.mu.Lock()
	defer sr.mu.Unlock()
	sr.endLocked(id, e, rd, evs, job, err)
}

// errReadAbandoned is the error of a shared read that no stream waited for any more when its
// turn came, or while it ran (cancelled): no stream receives it.
var errReadAbandoned = errors.New("read job events: no stream waits for the read")

// endLocked ends rd with its events, its job and its error, and starts the job's next read if a
// stream asked for one meanwhile.
func (sr *statusReads) endLocked(id string, e *jobReads, rd *sharedRead, evs []jobs.Event, job *jobs.Job, err error) {
	rd.evs, rd.job, rd.err = evs, job, err
	rd.upTo = rd.after
	if len(evs) > 0 {
		rd.upTo = max(rd.upTo, evs[len(evs)-1].Seq)
	}
	rd.data = make([]eventEncoding, len(evs))
	switch {
	case err == nil && (e.streams >= 2 || rd.final()):
		e.last = rd
	case e.streams < 2:
		e.last = nil
	}
	e.out = nil
	close(rd.done)
	if e.next != nil {
		sr.startLocked(id, e)
		return
	}
	sr.forgetLocked(id, e)
}

// final reports whether rd (nil: none) holds its job ended, with its terminal event: the last
// read of the job, unless an operator retries it. It is kept (last) while any stream follows the
// job, not only while several do: streams that open on the ended job take it (openingRead), and
// a stream that keeps it holds it anyway, until it has sent the terminal event and ends.
func (rd *sharedRead) final() bool {
	return rd != nil && rd.job != nil && rd.job.Status.Terminal() && rd.upTo >= rd.job.EventSeq
}

// ends reports whether a stream that sends r's events ends with them: they run up to the job's
// terminal event.
func (r *statusRead) ends() bool {
	return r.job.Status.Terminal() && len(r.evs) > 0 && r.evs[len(r.evs)-1].Seq >= r.job.EventSeq
}

// result is rd's events after after (after >= rd.after), and its job.
func (rd *sharedRead) result(after int) *statusRead {
	i := sort.Search(len(rd.evs), func(i int) bool { return rd.evs[i].Seq > after })
	return &statusRead{evs: rd.evs[i:], job: rd.job, shared: rd, first: i}
}

// eventData returns the data of the status event evs[i] of a read: the job as read, with the
// event's status (its state when the event is sent; the terminal event carries the result or
// the error). A shared read encodes each of its events once for all the streams it serves.
func (r *statusRead) eventData(i int) ([]byte, error) {
	encode := func() ([]byte, error) {
		snapshot := *r.job
		snapshot.Status = r.evs[i].Type
		b, err := json.Marshal(&snapshot)
		if err != nil {
			return nil, fmt.Errorf("encode job: %w", err)
		}
		return b, nil
	}
	if r.shared == nil {
		return encode()
	}
	enc := &r.shared.data[r.first+i]
	enc.once.Do(func() { enc.b, enc.err = encode() })
	return enc.b, enc.err
}

// renew renews the job's watch for a stream of it (follow) at its keep-alive, and returns the
// renewal: the number of the job's latest event when the watch took effect (every event up to it
// committed, every later one announced; see jobs.Store.WatchLatest). prev is the stream's last
// renewal (nil: none). A renewal that began less than half a keep-alive ago serves, unless it is
// prev: a stream's every keep-alive then takes a renewal newer than its last, so its watch never
// lapses (its TTL is 4 keep-alives), and 1,000 idle followers of one job cost Postgres one
// statement per half keep-alive, not one each per keep-alive. A renewal running serves too
// (it began after prev ended). Like a read, a renewal is the server's, takes turns (renewTurns:
// with no bound, as a read waits for its turn), and is bounded from its turn by StoreWait for a
// pool connection and by StoreTimeout in all: a pool busy fails it (the stream logs it and goes
// on), it does not hold the streams. It returns ctx's error if ctx ends first.
func (sr *statusReads) renew(ctx context.Context, id string, prev *watchRenewal) (*watchRenewal, error) {
	sr.mu.Lock()
	e := sr.jobs[id]
	if e == nil { // a caller that does not follow the job: an entry for this renewal only
		e = &jobReads{}
		sr.jobs[id] = e
	}
	if l := e.renewed; l != nil && l != prev && sr.now().Sub(l.at) < sr.fresh {
		sr.mu.Unlock()
		return l, nil
	}
	rw := e.renewing
	if rw == nil || rw == prev {
		rw = &watchRenewal{at: sr.now(), done: make(chan struct{})}
		e.renewing = rw
		go sr.runRenewal(id, e, rw)
	}
	sr.mu.Unlock()
	select {
	case <-rw.done:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	if rw.err != nil {
		return nil, rw.err
	}
	return rw, nil
}

// runRenewal renews the job's watch for rw once it has a turn (renewTurns).
func (sr *statusReads) runRenewal(id string, e *jobReads, rw *watchRenewal) {
	sr.renewTurns <- struct{}{}
	defer func() { <-sr.renewTurns }()
	ctx, cancel := sr.bounded()
	defer cancel()
	seq, err := sr.store.WatchLatest(ctx, id, sr.watchTTL)
	if err != nil && ctx.Err() != nil {
		err = fmt.Errorf("renew event watch: %w: %w", context.Cause(ctx), err)
	}
	sr.mu.Lock()
	defer sr.mu.Unlock()
	rw.seq, rw.err = seq, err
	if e.renewing == rw {
		e.renewing = nil
	}
	if err == nil {
		e.renewed = rw
	}
	close(rw.done)
	sr.forgetLocked(id, e)
}

// bounded returns the context of a shared read or renewal: the server's, not a stream's, bounded
// by StoreWait for a pool connection and by StoreTimeout in all.
func (sr *statusReads) bounded() (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithTimeoutCause(context.Background(), sr.timeout, errStoreTimeout)
	ctx, unbound := pgwait.Bound(ctx, sr.wait)
	return ctx, func() { unbound(); cancel() }
}
