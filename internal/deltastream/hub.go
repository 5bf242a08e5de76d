package deltastream

import (
	"context"
	"errors"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// subscribeWait bounds how long Subscribe waits for Redis to confirm a subscription. Past it the
// follower reads anyway; what it might miss, its periodic re-read finds.
const subscribeWait = 2 * time.Second

// Hub wakes a process's followers of streaming jobs when their buffers grow: one pub/sub
// connection for the whole process, one channel per followed job. Safe for concurrent use.
type Hub struct {
	b      *Buffer
	ps     *redis.PubSub
	cancel context.CancelFunc
	done   chan struct{}

	mu   sync.Mutex
	subs map[string]*channelSubs // by channel
}

type channelSubs struct {
	ready     chan struct{} // closed when Redis confirmed the subscription
	confirmed bool
	followers map[chan struct{}]struct{}
}

// NewHub starts a Hub; Close stops it.
func (b *Buffer) NewHub() *Hub {
	ctx, cancel := context.WithCancel(context.Background())
	h := &Hub{b: b, ps: b.cfg.Redis.Subscribe(ctx), cancel: cancel, done: make(chan struct{}),
		subs: map[string]*channelSubs{}}
	go h.run(ctx)
	return h
}

// Close stops the Hub and releases its connection. Followers' channels are left open.
func (h *Hub) Close() error {
	h.cancel()
	err := h.ps.Close()
	<-h.done
	return err
}

// Follow wakes the returned channel (capacity 1, never closed) whenever job id's buffer grows,
// until stop is called. It returns once Redis confirmed the subscription (or after a short
// wait, or when ctx ends), so that a read of the buffer after it misses no wake-up.
func (h *Hub) Follow(ctx context.Context, id string) (wake <-chan struct{}, stop func()) {
	name := h.b.Key(id)
	ch := make(chan struct{}, 1)
	// Subscribe and Unsubscribe are sent under h.mu, so that a follower joining as the last
	// one of the same job leaves cannot have its SUBSCRIBE overtaken by the other's UNSUBSCRIBE.
	h.mu.Lock()
	cs := h.subs[name]
	if cs == nil {
		cs = &channelSubs{ready: make(chan struct{}), followers: map[chan struct{}]struct{}{}}
		h.subs[name] = cs
		sctx, cancel := context.WithTimeout(ctx, subscribeWait)
		if err := h.ps.Subscribe(sctx, name); err != nil && ctx.Err() == nil {
			h.b.cfg.Logger.Warn("subscribe to stream deltas", "job_id", id, "error", err)
		}
		cancel()
	}
	cs.followers[ch] = struct{}{}
	ready := cs.ready
	h.mu.Unlock()
	t := time.NewTimer(subscribeWait)
	defer t.Stop()
	select {
	case <-ready:
	case <-t.C:
	case <-ctx.Done():
	}
	var once sync.Once
	return ch, func() { once.Do(func() { h.unfollow(name, ch) }) }
}

func (h *Hub) unfollow(name string, ch chan struct{}) {
	h.mu.Lock()
	defer h.mu.Unlock()
	cs := h.subs[name]
	delete(cs.followers, ch)
	if len(cs.followers) > 0 {
		return
	}
	delete(h.subs, name)
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_ = h.ps.Unsubscribe(ctx, name) // the connection is gone or closing: nothing left to do
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
			h.wake(m.Channel)
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
	default:
		// A resubscription after a reconnect: messages may have been lost meanwhile.
		h.wakeLocked(name)
	}
}

func (h *Hub) wake(name string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.wakeLocked(name)
}

func (h *Hub) wakeLocked(name string) {
	cs := h.subs[name]
	if cs == nil {
		return
	}
	for ch := range cs.followers {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}
