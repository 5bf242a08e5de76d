package deltastream_test

import (
	"bytes"
	"context"
	"errors"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/deltastream"
	"github.com/llmq/llmq/internal/redistest"
)

// stallDialer dials Redis with connections that hold the first write carrying marker (a
// channel's name: its SUBSCRIBE) until release is closed, as a network stall or a slow Redis
// holds a subscription; entered is closed once the write is held.
type stallDialer struct {
	marker   []byte
	once     sync.Once
	entered  chan struct{}
	release  chan struct{}
	released sync.Once
}

func newStallDialer(marker string) *stallDialer {
	return &stallDialer{marker: []byte(marker), entered: make(chan struct{}), release: make(chan struct{})}
}

func (d *stallDialer) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	return &stallConn{Conn: c, d: d}, nil
}

func (d *stallDialer) unstall() { d.released.Do(func() { close(d.release) }) }

type stallConn struct {
	net.Conn
	d *stallDialer
}

func (c *stallConn) Write(p []byte) (int, error) {
	if bytes.Contains(p, c.d.marker) {
		held := false
		c.d.once.Do(func() { held = true; close(c.d.entered) })
		if held {
			<-c.d.release
			// The stall ends in time: the write goes through whatever its deadline.
			_ = c.Conn.SetWriteDeadline(time.Time{})
		}
	}
	return c.Conn.Write(p)
}

// returnsWithin runs f and fails the test unless it returns within 5 s.
func returnsWithin(t *testing.T, what string, f func()) {
	t.Helper()
	done := make(chan struct{})
	go func() { defer close(done); f() }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatalf("%s did not return while another job's subscription was held", what)
	}
}

// TestHub_ASlowSubscribeStallsNoOtherFollower: while the hub's subscription to one job's channel
// is held up (Redis slow, a network stall), a second client of a job already followed is
// followed at once, a client leaving leaves at once, and a client of another job waits no
// longer than its own context; once the held subscription completes, every job is followed and
// receives its writes.
func TestHub_ASlowSubscribeStallsNoOtherFollower(t *testing.T) {
	t.Parallel()
	prefix := redistest.Prefix(t)
	opts, err := redis.ParseURL(redistest.URL())
	require.NoError(t, err)
	stall := newStallDialer(prefix + "{jobSlow}:deltas")
	opts.Dialer = stall.dial
	rdb := redis.NewClient(opts)
	t.Cleanup(func() { _ = rdb.Close() })
	buf := deltastream.New(deltastream.Config{Redis: rdb, Prefix: prefix})
	hub := buf.NewHub()
	defer hub.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()

	fast := hub.Follow(ctx, "jobFast")
	defer fast.Stop()
	defer stall.unstall() // first: the held write holds the connection

	slowFollowed := make(chan *deltastream.Follower, 1)
	go func() { slowFollowed <- hub.Follow(ctx, "jobSlow") }()
	select {
	case <-stall.entered:
	case <-ctx.Done():
		t.Fatal("the subscription to jobSlow was never sent")
	}

	var second *deltastream.Follower
	returnsWithin(t, "a second Follow of a followed job", func() { second = hub.Follow(ctx, "jobFast") })
	defer second.Stop()
	ended, end := context.WithCancel(ctx)
	end()
	var other *deltastream.Follower
	returnsWithin(t, "a Follow of another job whose context ended", func() { other = hub.Follow(ended, "jobOther") })
	returnsWithin(t, "Stop", func() { hub.Follow(ended, "jobGone").Stop() })
	defer other.Stop()

	stall.unstall()
	var slow *deltastream.Follower
	select {
	case slow = <-slowFollowed:
	case <-ctx.Done():
		t.Fatal("the Follow of jobSlow did not return once its subscription went through")
	}
	defer slow.Stop()

	for _, c := range []struct {
		job   string
		f     *deltastream.Follower
		early bool // Follow returned before the subscription
	}{{"jobFast", second, false}, {"jobSlow", slow, false}, {"jobOther", other, true}} {
		// The subscription to jobOther goes after jobSlow's: wait until it is live.
		require.Eventually(t, func() bool {
			n, err := redistest.NumSub(ctx, rdb, buf.Key(c.job))
			return err == nil && n == 1
		}, 10*time.Second, 5*time.Millisecond, "%s is not subscribed", c.job)
		if c.early {
			awaitWake(t, c.f.Wake())
			_, ok := c.f.Next(deltastream.Entry{})
			require.False(t, ok, "%s: subscribed after Follow returned, read the buffer", c.job)
		}
		w := buf.Writer(c.job, 2, 1)
		w.Add(deltastream.Delta{Type: "text", Text: "x"})
		awaitWake(t, c.f.Wake())
		got, ok := c.f.Next(deltastream.Entry{})
		if !ok && c.job == "jobSlow" {
			// Its Follow may have given up waiting (2 s) on a slow machine: read the buffer.
			got, err = buf.Read(ctx, c.job, "", 10)
			require.NoError(t, err)
		} else {
			require.True(t, ok, c.job)
		}
		require.Len(t, got, 1, c.job)
		w.Close(ctx)
	}
}

// TestHub_AFollowThatStoppedWaitingIsToldWhenSubscribed: a Follow that returned before Redis
// confirmed its subscription (its context ended, or the wait was up) may have missed what was
// published meanwhile, after its caller read the buffer: once the subscription is confirmed the
// follower is woken and Next says to read the buffer, which has the entry.
func TestHub_AFollowThatStoppedWaitingIsToldWhenSubscribed(t *testing.T) {
	t.Parallel()
	prefix := redistest.Prefix(t)
	opts, err := redis.ParseURL(redistest.URL())
	require.NoError(t, err)
	stall := newStallDialer(prefix + "{jobLate}:deltas")
	opts.Dialer = stall.dial
	rdb := redis.NewClient(opts)
	t.Cleanup(func() { _ = rdb.Close() })
	buf := deltastream.New(deltastream.Config{Redis: rdb, Prefix: prefix})
	hub := buf.NewHub()
	defer hub.Close()
	defer stall.unstall()
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()

	ended, end := context.WithCancel(ctx)
	end()
	var f *deltastream.Follower
	returnsWithin(t, "a Follow whose context ended", func() { f = hub.Follow(ended, "jobLate") })
	defer f.Stop()
	select {
	case <-stall.entered:
	case <-ctx.Done():
		t.Fatal("the subscription to jobLate was never sent")
	}
	read, err := buf.Read(ctx, "jobLate", "", 10)
	require.NoError(t, err)
	require.Empty(t, read, "the caller's read of the buffer")
	w := buf.Writer("jobLate", 2, 1)
	w.Add(deltastream.Delta{Type: "text", Text: "published before the subscription"})
	w.Close(ctx)

	stall.unstall()
	awaitWake(t, f.Wake())
	_, ok := f.Next(deltastream.Entry{})
	require.False(t, ok, "a batch may be missing: read the buffer")
	read, err = buf.Read(ctx, "jobLate", "", 10)
	require.NoError(t, err)
	require.Len(t, read, 1)
}

// resetDialer dials Redis with connections of which the first write carrying marker (a channel's
// name: its SUBSCRIBE) fails at once, as a connection that Redis or a proxy dropped while it was
// idle fails the next write; reset is closed once it did.
type resetDialer struct {
	marker []byte
	once   sync.Once
	reset  chan struct{}
}

func (d *resetDialer) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	return &resetConn{Conn: c, d: d}, nil
}

type resetConn struct {
	net.Conn
	d *resetDialer
}

func (c *resetConn) Write(p []byte) (int, error) {
	failed := false
	if bytes.Contains(p, c.d.marker) {
		c.d.once.Do(func() { failed = true })
	}
	if failed {
		_ = c.Conn.Close()
		close(c.d.reset)
		return 0, &net.OpError{Op: "write", Net: "tcp", Err: errors.New("connection reset by peer")}
	}
	return c.Conn.Write(p)
}

// TestHub_ASubscribeWhoseWriteFailedIsSentAgain: go-redis reconnects inside a SUBSCRIBE whose
// write failed and subscribes the new connection to the channels it knew before that command,
// not to the command's own: the hub sends the subscription again, so that the job is followed,
// and its follower told to read the buffer, without waiting for another reconnect.
func TestHub_ASubscribeWhoseWriteFailedIsSentAgain(t *testing.T) {
	t.Parallel()
	prefix := redistest.Prefix(t)
	opts, err := redis.ParseURL(redistest.URL())
	require.NoError(t, err)
	d := &resetDialer{marker: []byte(prefix + "{jobReset}:deltas"), reset: make(chan struct{})}
	opts.Dialer = d.dial
	rdb := redis.NewClient(opts)
	t.Cleanup(func() { _ = rdb.Close() })
	buf := deltastream.New(deltastream.Config{Redis: rdb, Prefix: prefix})
	hub := buf.NewHub()
	defer hub.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()

	before := hub.Follow(ctx, "jobBefore")
	defer before.Stop()
	ended, end := context.WithCancel(ctx)
	end()
	f := hub.Follow(ended, "jobReset")
	defer f.Stop()
	select {
	case <-d.reset:
	case <-ctx.Done():
		t.Fatal("the subscription to jobReset was never sent")
	}
	for _, job := range []string{"jobBefore", "jobReset"} {
		require.Eventually(t, func() bool {
			n, err := redistest.NumSub(ctx, rdb, buf.Key(job))
			return err == nil && n == 1
		}, 10*time.Second, 5*time.Millisecond, "%s is not subscribed", job)
	}
	awaitWake(t, f.Wake())
	_, ok := f.Next(deltastream.Entry{})
	require.False(t, ok, "subscribed after Follow returned: read the buffer")
	w := buf.Writer("jobReset", 2, 1)
	w.Add(deltastream.Delta{Type: "text", Text: "x"})
	awaitWake(t, f.Wake())
	got, ok := f.Next(deltastream.Entry{})
	require.True(t, ok)
	require.Len(t, got, 1)
	w.Close(ctx)
}
