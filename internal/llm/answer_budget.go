package llm

import (
	"context"
	"fmt"
	"io"
	"sync"
)

// AnswerBudget bounds the bytes of provider answers that the Providers sharing it hold at once:
// every Provider of a worker process shares one, so that 200 concurrent calls cannot hold 200
// answers of up to 32 MiB each. A call takes room before it sends its request (enough for an
// error body), more as its answer's body grows, and keeps what its answer holds until the caller
// calls Response.Release; a call that finds no room waits (until its context ends), none is
// dropped.
//
// Room is taken as the answer grows, and the largest answer is not known beforehand, so calls
// holding part of an answer could wait for each other for ever. A reserve the size of the largest
// answer prevents that: a call that finds the shared part full takes the reserve when it is free,
// and then grows without waiting up to its answer's limit; the others wait for it. The bound is
// total, reserve included. The transport's own buffers are not counted, nor, for a moment while a
// body's buffer grows, its previous copy.
//
// An AnswerBudget is safe for concurrent use.
type AnswerBudget struct {
	total, reserve int64

	mu       sync.Mutex
	free     int64 // shared bytes not held
	reserved bool  // an answer holds the reserve
	inUse    int64
	waiting  int
	changed  chan struct{} // closed and replaced when bytes are given back
}

// NewAnswerBudget returns a budget of total bytes for answers of at most maxAnswer bytes each (a
// Provider's MaxResponseBytes; error bodies are read up to 64 KiB). It returns an error when total
// is smaller than the largest answer: one answer must always fit.
func NewAnswerBudget(total, maxAnswer int64) (*AnswerBudget, error) {
	reserve := max(maxAnswer, maxErrorBodyBytes)
	if total < reserve {
		return nil, fmt.Errorf("llm: answer budget of %d bytes is smaller than the largest answer (%d bytes)", total, reserve)
	}
	return &AnswerBudget{total: total, reserve: reserve, free: total - reserve, changed: make(chan struct{})}, nil
}

// InUse returns the bytes of answers held now (for metrics and tests).
func (b *AnswerBudget) InUse() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.inUse
}

// Waiting returns how many calls wait for room now (for metrics and tests).
func (b *AnswerBudget) Waiting() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.waiting
}

// Total returns the bound, in bytes.
func (b *AnswerBudget) Total() int64 { return b.total }

// hold takes n bytes for a new answer, waiting for room until ctx ends. A nil budget holds nothing
// (the nil *answerHold is valid: every method is a no-op on it).
func (b *AnswerBudget) hold(ctx context.Context, n int64) (*answerHold, error) {
	if b == nil {
		return nil, nil
	}
	h := &answerHold{b: b}
	if err := h.grow(ctx, n); err != nil {
		return nil, err
	}
	return h, nil
}

// broadcast wakes every waiter; b.mu must be held.
func (b *AnswerBudget) broadcast() {
	close(b.changed)
	b.changed = make(chan struct{})
}

// answerHold is the room one answer holds in an AnswerBudget. It is used by one goroutine at a
// time.
type answerHold struct {
	b           *AnswerBudget
	shared      int64 // bytes held from the shared part
	fromReserve int64 // bytes held from the reserve
	usesReserve bool  // this answer holds the reserve
}

// size returns the bytes held.
func (h *answerHold) size() int64 {
	if h == nil {
		return 0
	}
	return h.shared + h.fromReserve
}

// grow takes n more bytes: from the shared part, else from the reserve when it is free (and then
// every later growth of this answer too: the reserve fits the largest answer), else it waits for
// bytes to be given back, until ctx ends.
func (h *answerHold) grow(ctx context.Context, n int64) error {
	if h == nil || n <= 0 {
		return nil
	}
	b := h.b
	for {
		b.mu.Lock()
		took := true
		switch {
		case h.usesReserve:
			h.fromReserve += n
		case b.free >= n:
			b.free -= n
			h.shared += n
		case !b.reserved:
			b.reserved, h.usesReserve = true, true
			h.fromReserve += n
		default:
			took = false
		}
		if took {
			b.inUse += n
			b.mu.Unlock()
			return nil
		}
		changed := b.changed
		b.waiting++
		b.mu.Unlock()
		select {
		case <-ctx.Done():
		case <-changed:
		}
		b.mu.Lock()
		b.waiting--
		b.mu.Unlock()
		if err := ctx.Err(); err != nil {
			return err
		}
	}
}

// settle keeps n of the bytes held (the answer is read: what its buffer holds) and gives the rest
// back. An answer done reading moves what it keeps out of the reserve when the shared part has
// room, so that the reserve serves answers still being read.
func (h *answerHold) settle(n int64) {
	if h == nil {
		return
	}
	b := h.b
	b.mu.Lock()
	defer b.mu.Unlock()
	if excess := h.size() - n; excess > 0 {
		fromReserve := min(excess, h.fromReserve)
		h.fromReserve -= fromReserve
		h.shared -= excess - fromReserve
		b.free += excess - fromReserve
		b.inUse -= excess
	}
	if h.usesReserve && b.free >= h.fromReserve {
		b.free -= h.fromReserve
		h.shared += h.fromReserve
		h.fromReserve, h.usesReserve, b.reserved = 0, false, false
	}
	b.broadcast()
}

// release gives every byte held back.
func (h *answerHold) release() {
	if h == nil {
		return
	}
	b := h.b
	b.mu.Lock()
	defer b.mu.Unlock()
	b.free += h.shared
	b.inUse -= h.size()
	if h.usesReserve {
		b.reserved = false
	}
	h.shared, h.fromReserve, h.usesReserve = 0, 0, false
	b.broadcast()
}

// readBody reads r to its end, at most limit bytes, into a buffer whose every byte hold holds
// first (waiting for room with ctx). size is the announced length (ContentLength: -1 unknown); the
// buffer starts at it, else small, and doubles. cut reports that r had more than limit bytes (the
// rest is not read).
func readBody(ctx context.Context, r io.Reader, limit, size int64, hold *answerHold) (data []byte, cut bool, err error) {
	const small = 16 << 10
	c := min(int64(small), limit)
	if size >= 0 {
		c = min(size, limit)
	}
	buf, err := growBuffer(ctx, nil, c, hold)
	if err != nil {
		return nil, false, err
	}
	for {
		if len(buf) == cap(buf) {
			if int64(len(buf)) >= limit {
				var one [1]byte
				n, err := io.ReadFull(r, one[:])
				if n > 0 {
					return buf, true, nil
				}
				if err == io.EOF {
					err = nil
				}
				return buf, false, err
			}
			if buf, err = growBuffer(ctx, buf, min(max(2*int64(cap(buf)), small), limit), hold); err != nil {
				return buf, false, err
			}
		}
		n, err := r.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if err == io.EOF {
			return buf, false, nil
		}
		if err != nil {
			return buf, false, err
		}
	}
}

// growBuffer returns buf with capacity c (at least its own), the room held first.
func growBuffer(ctx context.Context, buf []byte, c int64, hold *answerHold) ([]byte, error) {
	if c <= int64(cap(buf)) && buf != nil {
		return buf, nil
	}
	if err := hold.grow(ctx, c-hold.size()); err != nil {
		return buf, err
	}
	grown := make([]byte, len(buf), c)
	copy(grown, buf)
	return grown, nil
}
