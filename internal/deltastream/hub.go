package deltastream

import (
	"context"
	"encoding/json"
	"errors"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// subscribeWait bounds how long Subscribe waits for Redis to confirm a subscription. Past it the
// follower reads anyway; what it might miss, its periodic re-read finds.
const subscribeWait = 2 * time.Second

// Hub hands a process's followers of streaming jobs the entries written to their buffers: one
// pub/sub connection for the whole process, one channel per followed job, each message a batch.
// Safe for concurrent use.
//
// The SUBSCRIBE and UNSUBSCRIBE commands go from one goroutine of the hub's own (subscribe),
// never from a caller of Follow or Stop, and never under mu: a subscription held up (Redis slow,
// a network stall) holds up no other client's Follow or Stop, nor the hub's delivery under mu;
// the changes made meanwhile go together in the next round. A SUBSCRIBE that failed is sent
// again (subscribeRetry). The connection is a client's of the hub's own, whose writes go from a
// goroutine of their own (hubClient): a SUBSCRIBE whose write is held holds no delivery either
// (unless more than queuedMax bytes wait to be written).
type Hub struct {
	b      *Buffer
	ps     *redis.PubSub
	client redis.UniversalClient // ps's, the hub's own (nil: Buffer's, not closed by Close)
	cancel context.CancelFunc
	done   chan struct{} // closed when run returned
	// changed (capacity 1) wakes subscribe; subDone is closed when it returned.
	changed chan struct{}
	subDone chan struct{}

	mu   sync.Mutex
	subs map[string]*channelSubs // by channel
	// pending names the channels whose followers came or went since subscribe last looked.
	pending map[string]struct{}
}

type channelSubs struct {
	ready     chan struct{} // closed when Redis confirmed the subscription
	confirmed bool
	// sent is set when subscribe sent the channel's SUBSCRIBE; the channel stays in Hub.subs,
	// followers or not, until subscribe sent its UNSUBSCRIBE (or, never sent, dropped it), so a
	// follower joining meanwhile finds it subscribed, and no UNSUBSCRIBE overtakes a SUBSCRIBE.
	sent      bool
	followers map[*Follower]struct{}
}

// batch is one write to a job's buffer, as published (writeScript): its entries, in order.
type batch struct {
	Entries []batchEntry `json:"entries"`
}

type batchEntry struct {
	ID string          `json:"id"`
	S  int             `json:"s"`
	N  int             `json:"n"`
	K  string          `json:"k"`
	D  json.RawMessage `json:"d"`
	// attempt is D's, read once by the hub for all the followers (attemptOf).
	attempt int
}

// parseBatch reads a published batch. The writers' script gives each entry's data length
// ("dl"), so that the message is read field by field with only the data checked (json.Valid),
// where decoding it whole was most of an API replica's own work per message; a message in any
// other form (a writer of an earlier version) is decoded whole. ok is false when msg is not a
// batch. Every entry's D is valid JSON.
func parseBatch(msg []byte) (b batch, ok bool) {
	if b, ok := scanBatch(msg); ok {
		return b, true
	}
	return b, json.Unmarshal(msg, &b) == nil
}

// scanBatch reads msg written exactly as writeScript writes it; ok is false for any other form.
func scanBatch(msg []byte) (b batch, ok bool) {
	p := batchScanner{rest: msg}
	if !p.lit(`{"entries":[`) {
		return batch{}, false
	}
	for {
		var e batchEntry
		var dl int
		if !p.lit(`{"id":"`) || !p.until('"', &e.ID) || !p.lit(`,"s":`) || !p.int(&e.S) || !p.lit(`,"n":`) || !p.int(&e.N) ||
			!p.lit(`,"k":"`) || !p.until('"', &e.K) || !p.lit(`,"dl":`) || !p.int(&dl) || !p.lit(`,"d":`) ||
			dl > len(p.rest) || !json.Valid(p.rest[:dl]) {
			return batch{}, false
		}
		e.D, p.rest = p.rest[:dl:dl], p.rest[dl:]
		b.Entries = append(b.Entries, e)
		switch {
		case p.lit(`},`):
		case p.lit(`}]}`) && len(p.rest) == 0:
			return b, true
		default:
			return batch{}, false
		}
	}
}

// batchScanner reads a published batch from its start.
type batchScanner struct{ rest []byte }

// lit consumes s.
func (p *batchScanner) lit(s string) bool {
	if len(p.rest) < len(s) || string(p.rest[:len(s)]) != s {
		return false
	}
	p.rest = p.rest[len(s):]
	return true
}

// until consumes the text before stop, printable ASCII without a quote or backslash (as the IDs
// and kinds are), into *s, and stop itself.
func (p *batchScanner) until(stop byte, s *string) bool {
	for i, c := range p.rest {
		switch {
		case c == stop:
			*s, p.rest = string(p.rest[:i]), p.rest[i+1:]
			return true
		case c < 0x20 || c > 0x7e || c == '"' || c == '\\':
			return false
		}
	}
	return false
}

// int consumes a non-negative integer of at most 9 digits, without leading zeros.
func (p *batchScanner) int(n *int) bool {
	v, digits := 0, 0
	for ; digits < len(p.rest) && p.rest[digits] >= '0' && p.rest[digits] <= '9'; digits++ {
		v = v*10 + int(p.rest[digits]-'0')
	}
	if digits == 0 || digits > 9 || (digits > 1 && p.rest[0] == '0') {
		return false
	}
	*n, p.rest = v, p.rest[digits:]
	return true
}

// inboxMax bounds the batches a follower holds between two calls of Next: past it they are
// dropped, and the follower reads the buffer instead.
const inboxMax = 256

// Follower receives the entries written to one job's buffer (Hub.Follow).
type Follower struct {
	h     *Hub
	name  string
	wake  chan struct{}
	once  sync.Once
	mu    sync.Mutex
	inbox []batch
	lost  bool // a batch may be missing from inbox
	// early is set when Follow returned before Redis confirmed the subscription (under Hub.mu):
	// the confirmation tells the follower that a batch may be missing.
	early bool
}

// Wake is signalled (capacity 1, never closed) whenever entries arrive, or may have been lost.
func (f *Follower) Wake() <-chan struct{} { return f.wake }

// Next returns the entries received since the last call that follow last, the last entry the
// caller read (the zero Entry: none), in order. The caller reads the buffer once after Follow
// returns, and goes on from there with Next. ok is false when they may not follow it
// directly: the caller then reads the buffer after last.ID (Buffer.Read). That is when a batch
// may be missing (the connection to Redis was lost, the inbox overflowed, a message was not a
// batch), and when the first entry received is not the one after last: entries of an attempt
// are numbered 1, 2, ... (Entry.N), and an attempt may follow another only after its reset
// entry (one whose worker died has none).
func (f *Follower) Next(last Entry) (entries []Entry, ok bool) {
	batches, complete := f.take()
	if !complete {
		return nil, false
	}
	return after(last, batches)
}

// take returns the batches received since the last take, in the order written; complete is false
// when one may be missing.
func (f *Follower) take() (batches []batch, complete bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	batches, complete = f.inbox, !f.lost
	f.inbox, f.lost = nil, false
	return batches, complete
}

// Stop ends the following. Safe to call more than once.
func (f *Follower) Stop() { f.once.Do(func() { f.h.unfollow(f.name, f) }) }

// deliver queues b (nil: lost) and signals.
func (f *Follower) deliver(b *batch) {
	f.mu.Lock()
	switch {
	case b == nil || len(f.inbox) >= inboxMax:
		f.inbox, f.lost = nil, true
	default:
		f.inbox = append(f.inbox, *b)
	}
	f.mu.Unlock()
	select {
	case f.wake <- struct{}{}:
	default:
	}
}

// after returns the entries of batches after last; ok is false when they do not follow it
// directly. Batches read already (a batch is written, and so read, whole) are skipped.
func after(last Entry, batches []batch) (entries []Entry, ok bool) {
	for _, b := range batches {
		for _, be := range b.Entries {
			// D is valid JSON: the hub decoded the whole message (json.Unmarshal checks it all).
			e := Entry{ID: be.ID, Seq: be.S, N: be.N, Kind: be.K, Data: be.D, Attempt: be.attempt}
			if last.ID != "" && !idAfter(e.ID, last.ID) {
				continue
			}
			if !follows(e, last) || len(e.Data) == 0 {
				return nil, false
			}
			entries = append(entries, e)
			last = e
		}
	}
	return entries, true
}

// follows reports whether e is the entry right after last (the zero Entry: before the first).
func follows(e, last Entry) bool {
	switch {
	case last.ID == "":
		return e.N == 1
	case e.Seq == last.Seq:
		return e.N == last.N+1
	default:
		return e.Seq > last.Seq && e.N == 1 && last.Kind == KindReset
	}
}

// idAfter reports whether stream entry ID a ("ms-seq") comes after b.
func idAfter(a, b string) bool {
	am, as, _ := strings.Cut(a, "-")
	bm, bs, _ := strings.Cut(b, "-")
	ams, _ := strconv.ParseUint(am, 10, 64)
	bms, _ := strconv.ParseUint(bm, 10, 64)
	if ams != bms {
		return ams > bms
	}
	asq, _ := strconv.ParseUint(as, 10, 64)
	bsq, _ := strconv.ParseUint(bs, 10, 64)
	return asq > bsq
}

// NewHub starts a Hub; Close stops it.
func (b *Buffer) NewHub() *Hub {
	ctx, cancel := context.WithCancel(context.Background())
	client, own := hubClient(b.cfg.Redis)
	h := &Hub{b: b, ps: client.Subscribe(ctx), cancel: cancel, done: make(chan struct{}),
		changed: make(chan struct{}, 1), subDone: make(chan struct{}),
		subs: map[string]*channelSubs{}, pending: map[string]struct{}{}}
	if own {
		h.client = client
	}
	go h.run(ctx)
	go h.subscribe(ctx)
	return h
}

// Close stops the Hub and releases its connection. Followers' channels are left open.
func (h *Hub) Close() error {
	h.cancel()
	err := h.ps.Close()
	<-h.done
	<-h.subDone
	if h.client != nil {
		err = errors.Join(err, h.client.Close())
	}
	return err
}

// Follow returns the follower of job id's buffer, which receives every batch written to it
// until Stop. It returns once Redis confirmed the subscription (or after a short wait, or when
// ctx ends), so that a read of the buffer after it misses no batch; when it returned before,
// the confirmation wakes the follower and its Next says to read the buffer.
func (h *Hub) Follow(ctx context.Context, id string) *Follower {
	name := h.b.Key(id)
	f := &Follower{h: h, name: name, wake: make(chan struct{}, 1)}
	h.mu.Lock()
	cs := h.subs[name]
	if cs == nil {
		cs = &channelSubs{ready: make(chan struct{}), followers: map[*Follower]struct{}{}}
		h.subs[name] = cs
		h.changedLocked(name)
	}
	cs.followers[f] = struct{}{}
	ready := cs.ready
	h.mu.Unlock()
	t := time.NewTimer(subscribeWait)
	defer t.Stop()
	select {
	case <-ready:
	case <-t.C:
	case <-ctx.Done():
	}
	h.mu.Lock()
	// The caller reads the buffer next: what is published before the subscription is
	// confirmed, after that read, reaches neither.
	f.early = !cs.confirmed
	h.mu.Unlock()
	return f
}

func (h *Hub) unfollow(name string, f *Follower) {
	h.mu.Lock()
	defer h.mu.Unlock()
	cs := h.subs[name]
	delete(cs.followers, f)
	if len(cs.followers) == 0 {
		h.changedLocked(name)
	}
}

// changedLocked has subscribe look at channel name again. Call with mu held.
func (h *Hub) changedLocked(name string) {
	h.pending[name] = struct{}{}
	select {
	case h.changed <- struct{}{}:
	default:
	}
}

// subscribeRetry is how long after a failed SUBSCRIBE its channels are subscribed again.
const subscribeRetry = time.Second

// subscribe keeps the connection subscribed to the channels followed, until ctx ends: each round
// unsubscribes from the channels that lost their last follower and subscribes to the new ones,
// each in one command, outside mu (see Hub). The rounds go one at a time, so a channel's
// commands reach Redis in the order of its followers' coming and going. A SUBSCRIBE that failed
// is sent again (subscribeRetry later) to the channels still followed: go-redis, reconnecting
// inside the failed command, subscribes the new connection only to the channels it had before.
// (Through the hub's own client a write fails inside the command only when an earlier write
// failed; one that fails later closes the connection, and go-redis subscribes the new one to
// every channel, the command's included.)
func (h *Hub) subscribe(ctx context.Context) {
	defer close(h.subDone)
	var retry []string // the channels of the SUBSCRIBEs that failed since the last retry
	var again <-chan time.Time
	failing := false // the last SUBSCRIBE failed: the next failure is not logged again
	for {
		select {
		case <-ctx.Done():
			return
		case <-h.changed:
		case <-again:
			again = nil
		}
		var sub, unsub []string
		h.mu.Lock()
		if again == nil {
			// Before the new ones: a channel subscribed since (sent) is not subscribed twice.
			for _, name := range retry {
				if cs := h.subs[name]; cs != nil && cs.sent && len(cs.followers) > 0 {
					sub = append(sub, name)
				}
			}
			retry = nil
		}
		for name := range h.pending {
			cs := h.subs[name]
			switch {
			case cs == nil:
			case len(cs.followers) == 0:
				delete(h.subs, name)
				if cs.sent {
					unsub = append(unsub, name)
				}
			case !cs.sent:
				cs.sent = true
				sub = append(sub, name)
			}
		}
		clear(h.pending)
		h.mu.Unlock()
		if len(unsub) > 0 {
			uctx, cancel := context.WithTimeout(ctx, time.Second)
			_ = h.ps.Unsubscribe(uctx, unsub...) // the connection is gone or closing: nothing left to do
			cancel()
		}
		if len(sub) > 0 {
			sctx, cancel := context.WithTimeout(ctx, subscribeWait)
			err := h.ps.Subscribe(sctx, sub...)
			cancel()
			switch {
			case err == nil:
				failing = false
			case ctx.Err() == nil:
				if !failing {
					h.b.cfg.Logger.Warn("subscribe to stream deltas", "channels", len(sub), "error", err)
				}
				failing = true
				retry = append(retry, sub...)
				if again == nil {
					again = time.After(subscribeRetry)
				}
			}
		}
	}
}

// run receives confirmations and messages until Close.
func (h *Hub) run(ctx context.Context) {
	defer close(h.done)
	for {
		msg, err := h.ps.Receive(ctx)
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, redis.ErrClosed) {
				return
			}
			// go-redis reconnects and subscribes again on the next Receive.
			select {
			case <-ctx.Done():
				return
			case <-time.After(100 * time.Millisecond):
			}
			continue
		}
		switch m := msg.(type) {
		case *redis.Subscription:
			if strings.EqualFold(m.Kind, "subscribe") {
				h.confirm(m.Channel)
			}
		case *redis.Message:
			b, ok := parseBatch([]byte(m.Payload))
			if !ok {
				h.deliver(m.Channel, nil) // not a batch (a writer of an older version): read the buffer
				continue
			}
			for i := range b.Entries {
				b.Entries[i].attempt = attemptOf(b.Entries[i].D)
			}
			h.deliver(m.Channel, &b)
		}
	}
}

func (h *Hub) confirm(name string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	cs := h.subs[name]
	switch {
	case cs == nil:
	case !cs.confirmed:
		cs.confirmed = true
		close(cs.ready)
		for f := range cs.followers {
			if f.early {
				f.early = false
				f.deliver(nil) // it stopped waiting: a batch may have been missed
			}
		}
	default:
		// A resubscription after a reconnect: messages may have been lost meanwhile.
		h.deliverLocked(name, nil)
	}
}

// deliver hands b (nil: a batch may have been lost) to the channel's followers.
func (h *Hub) deliver(name string, b *batch) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.deliverLocked(name, b)
}

func (h *Hub) deliverLocked(name string, b *batch) {
	cs := h.subs[name]
	if cs == nil {
		return
	}
	for f := range cs.followers {
		f.deliver(b)
	}
}
