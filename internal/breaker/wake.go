package breaker

import (
	"context"
	"fmt"
	"sync"
	"time"
)

// wakeChannel is the Redis pub/sub channel on which Report announces, with the credential's tag
// as the message, that a refused caller may now be admitted (a probe or a cold-start slot
// reported).
func wakeChannel(prefix string) string { return prefix + "cb:wake" }

// wakeHub hands out, per credential tag, a channel that is closed at the next wake-up.
type wakeHub struct {
	mu    sync.Mutex
	chans map[string]chan struct{}
}

func (h *wakeHub) get(tag string) <-chan struct{} {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.chans == nil {
		h.chans = make(map[string]chan struct{})
	}
	ch := h.chans[tag]
	if ch == nil {
		ch = make(chan struct{})
		h.chans[tag] = ch
	}
	return ch
}

func (h *wakeHub) wake(tag string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if ch := h.chans[tag]; ch != nil {
		close(ch)
		delete(h.chans, tag)
	}
}

// Listen subscribes to the wake-ups that Reports publish, in whichever process, so that
// Circuit.Wakeup channels close as soon as a probe or a cold-start request reports, instead
// of callers waiting out Admission.Wait. Run it once per Breaker, for as long as callers wait;
// it returns when ctx ends. Without it, Wakeup channels never close and callers fall back to
// their timers. go-redis (re-)subscribes in the background whenever the connection is lost or
// Redis is not up yet; wake-ups published meanwhile are missed (callers wait their timers).
func (b *Breaker) Listen(ctx context.Context) {
	ps := b.rdb.Subscribe(ctx, wakeChannel(b.cfg.Prefix))
	defer ps.Close()
	msgs := ps.Channel()
	for {
		select {
		case <-ctx.Done():
			return
		case m, ok := <-msgs:
			if !ok {
				return
			}
			b.wakes.wake(m.Payload)
		}
	}
}

// Wakeup returns a channel that is closed when a Report of this credential's probe or
// cold-start request is next heard by Listen. Take it before Allow, then wait on it (and on a
// timer of Admission.Wait) after a refusal: a wake-up between the two is not missed.
func (c *Circuit) Wakeup() <-chan struct{} { return c.b.wakes.get(c.tag) }

// Await waits for wake (from Wakeup), d, or ctx, whichever comes first. It returns ctx's cause
// when ctx ended first, nil otherwise.
func Await(ctx context.Context, wake <-chan struct{}, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return context.Cause(ctx)
	case <-wake:
	case <-t.C:
	}
	return nil
}

// publishWake tells every Listen that the credential's refused callers may ask again.
func (c *Circuit) publishWake(ctx context.Context) error {
	if err := c.b.rdb.Publish(ctx, wakeChannel(c.b.cfg.Prefix), c.tag).Err(); err != nil {
		return fmt.Errorf("breaker wake: %w", err)
	}
	return nil
}
