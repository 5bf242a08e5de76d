package deltastream

import (
	"context"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// queuedMax bounds the bytes a queuedConn holds unwritten: tens of thousands of subscriptions.
// A Write past it waits for room (for the writes before it to go, or to fail at their deadline).
const queuedMax = 1 << 20

// hubClient returns a client of its own for the hub's pub/sub connection, made from rdb's
// options, whose connections write through a goroutine of their own (queuedConn): go-redis's
// PubSub holds one lock while it writes a command and again after each message it reads, so a
// SUBSCRIBE whose write blocked held every delivery of the process. own is false when rdb is of
// a kind without that copy (neither a Client, a failover one included, nor a ClusterClient): the
// hub then subscribes through rdb, and a blocked write holds its deliveries as before.
func hubClient(rdb redis.UniversalClient) (c redis.UniversalClient, own bool) {
	switch rdb := rdb.(type) {
	case *redis.Client:
		opt := *rdb.Options()
		if opt.MaintNotificationsConfig != nil {
			mn := *opt.MaintNotificationsConfig
			opt.MaintNotificationsConfig = &mn
		}
		opt.MinIdleConns = 0 // the hub dials its one connection, no idle ones
		// A client's push processor and cache are its own: rdb's processor (NewClient keeps it
		// in the options) would refuse the copy's handlers.
		opt.PushNotificationProcessor = nil
		opt.ClientSideCache, opt.ClientSideCacheConfig = nil, nil
		c := redis.NewClient(&opt)
		c.AddHook(queuedWrites{})
		return c, true
	case *redis.ClusterClient:
		opt := *rdb.Options()
		opt.MinIdleConns = 0
		newNode := opt.NewClient // set by rdb's NewClusterClient
		if newNode == nil {
			newNode = redis.NewClient
		}
		opt.NewClient = func(o *redis.Options) *redis.Client {
			node := newNode(o)
			node.AddHook(queuedWrites{}) // before the node dials: its pools dial on first use
			return node
		}
		return redis.NewClusterClient(&opt), true
	default:
		return rdb, false
	}
}

// queuedWrites is a go-redis hook that dials queuedConns; it leaves commands alone.
type queuedWrites struct{}

func (queuedWrites) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := next(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return newQueuedConn(c), nil
	}
}

func (queuedWrites) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }

func (queuedWrites) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// queuedConn is a connection whose Write queues a copy of its bytes and returns, and whose own
// goroutine writes them, in order, each given the time its write deadline left it when it was
// queued, counted from when its own write starts (a write held keeps the ones behind it waiting,
// but costs them none of their time: go-redis gave each its deadline when it wrote it itself).
// A write that fails (its time ran out: the network stalled, Redis stopped reading) closes the
// connection, so that its reader fails too and go-redis connects again, as when its own write
// fails; every Write after it returns that error. At most queuedMax bytes wait: a Write past it
// waits until the writes before it went or failed (one larger than queuedMax waits for all). Safe
// for one writer and one reader at a time, as a net.Conn.
type queuedConn struct {
	net.Conn
	wake      chan struct{} // capacity 1: something was queued
	room      chan struct{} // capacity 1: a write went, or failed
	done      chan struct{} // closed by Close
	closeOnce sync.Once

	mu       sync.Mutex
	queue    []queuedWrite
	queued   int       // bytes in queue and being written
	deadline time.Time // the write deadline of the writes queued next
	err      error     // the connection's failure: every Write returns it
}

type queuedWrite struct {
	p []byte
	// deadline, if not zero, is the write deadline given, and queuedAt when it was queued: the
	// write has deadline-queuedAt from when it starts.
	deadline, queuedAt time.Time
}

func newQueuedConn(c net.Conn) *queuedConn {
	q := &queuedConn{Conn: c, wake: make(chan struct{}, 1), room: make(chan struct{}, 1),
		done: make(chan struct{})}
	go q.writeLoop()
	return q
}

// Write queues a copy of p (go-redis reuses its buffer) for writeLoop; past queuedMax it waits
// for room first.
func (q *queuedConn) Write(p []byte) (int, error) {
	q.mu.Lock()
	for q.err == nil && q.queued > 0 && q.queued+len(p) > queuedMax {
		q.mu.Unlock()
		select {
		case <-q.room:
		case <-q.done:
		}
		q.mu.Lock()
	}
	if q.err != nil {
		err := q.err
		q.mu.Unlock()
		return 0, err
	}
	w := queuedWrite{p: append([]byte(nil), p...), deadline: q.deadline}
	if !w.deadline.IsZero() {
		w.queuedAt = time.Now()
	}
	q.queue = append(q.queue, w)
	q.queued += len(p)
	q.mu.Unlock()
	select {
	case q.wake <- struct{}{}:
	default:
	}
	return len(p), nil
}

// writeLoop writes what Write queued until Close or a write's failure.
func (q *queuedConn) writeLoop() {
	for {
		select {
		case <-q.done:
			return
		case <-q.wake:
		}
		q.mu.Lock()
		writes := q.queue
		q.queue = nil
		q.mu.Unlock()
		for _, w := range writes {
			deadline := w.deadline
			if !deadline.IsZero() {
				deadline = deadline.Add(time.Since(w.queuedAt))
			}
			err := q.Conn.SetWriteDeadline(deadline)
			if err == nil {
				_, err = q.Conn.Write(w.p)
			}
			q.mu.Lock()
			q.queued -= len(w.p)
			if err != nil && q.err == nil {
				q.err = fmt.Errorf("deltastream: pub/sub write: %w", err)
			}
			failed := q.err != nil
			q.mu.Unlock()
			select {
			case q.room <- struct{}{}:
			default:
			}
			if failed {
				_ = q.Conn.Close() // the reader fails, and go-redis connects again
				return
			}
		}
	}
}

// SetWriteDeadline sets the deadline of the writes queued next.
func (q *queuedConn) SetWriteDeadline(t time.Time) error {
	q.mu.Lock()
	q.deadline = t
	q.mu.Unlock()
	return nil
}

// SetDeadline sets the read deadline, and that of the writes queued next.
func (q *queuedConn) SetDeadline(t time.Time) error {
	_ = q.SetWriteDeadline(t)
	return q.Conn.SetReadDeadline(t)
}

// Close closes the connection and ends writeLoop; what is queued is not written.
func (q *queuedConn) Close() error {
	q.closeOnce.Do(func() {
		q.mu.Lock()
		if q.err == nil {
			q.err = net.ErrClosed
		}
		q.mu.Unlock()
		close(q.done)
	})
	return q.Conn.Close()
}
