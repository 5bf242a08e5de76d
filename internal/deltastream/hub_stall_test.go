package deltastream_test

import (
	"bytes"
	"context"
	"errors"
	"net"
	neturl "net/url"
	"os"
	"strconv"
	"strings"
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
	marker []byte
	// expire: the held write fails at its write deadline, as a stall longer than the deadline
	// fails it, instead of going through once released.
	expire   bool
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
	d        *stallDialer
	deadline time.Time // the write deadline (one writer at a time)
}

func (c *stallConn) SetWriteDeadline(t time.Time) error {
	c.deadline = t
	return c.Conn.SetWriteDeadline(t)
}

func (c *stallConn) Write(p []byte) (int, error) {
	if bytes.Contains(p, c.d.marker) {
		held := false
		c.d.once.Do(func() { held = true; close(c.d.entered) })
		if held && c.d.expire {
			t := time.NewTimer(time.Until(c.deadline))
			defer t.Stop()
			select {
			case <-t.C:
			case <-c.d.release:
			}
			return 0, &net.OpError{Op: "write", Net: "tcp", Err: os.ErrDeadlineExceeded}
		}
		if held {
			<-c.d.release
			// The stall ends in time: the write goes through whatever its deadline.
			_ = c.Conn.SetWriteDeadline(time.Time{})
		}
	}
	return c.Conn.Write(p)
}

// returnsWithin runs f and fails the test unless it returns within 30 s: the callers' contexts
// last longer, so that a call that waited for its context's end is not taken for one that
// returned.
func returnsWithin(t *testing.T, what string, f func()) {
	t.Helper()
	done := make(chan struct{})
	go func() { defer close(done); f() }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
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
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
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
		}, 30*time.Second, 5*time.Millisecond, "%s is not subscribed", c.job)
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
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
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
		}, 30*time.Second, 5*time.Millisecond, "%s is not subscribed", job)
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

// stallClient returns a client of the Redis or Redis Cluster at url (redistest.ClientOf's
// forms) that dials through d, closed when the test ends.
func stallClient(t *testing.T, url string, d *stallDialer) redis.UniversalClient {
	t.Helper()
	var c redis.UniversalClient
	if rest, ok := strings.CutPrefix(url, "redis-cluster://"); ok {
		u, err := neturl.Parse("redis://" + rest)
		require.NoError(t, err)
		opt := &redis.ClusterOptions{Addrs: strings.Split(u.Host, ","), Dialer: d.dial}
		if u.User != nil {
			opt.Username = u.User.Username()
			opt.Password, _ = u.User.Password()
		}
		c = redis.NewClusterClient(opt)
	} else {
		opts, err := redis.ParseURL(url)
		require.NoError(t, err)
		opts.Dialer = d.dial
		c = redis.NewClient(opts)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// TestHub_ASlowSubscribeHoldsNoDelivery: while the write of the hub's subscription to one job's
// channel is held (the connection's send buffer full: a network stall, a Redis that stopped
// reading), the jobs already followed go on receiving their writes, each in order, none
// missing; once the write goes through, the held job is followed too.
func TestHub_ASlowSubscribeHoldsNoDelivery(t *testing.T) {
	t.Parallel()
	for name, url := range map[string]string{"Redis": redistest.URL(), "Cluster": redistest.ClusterURL()} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			prefix := redistest.PrefixOn(t, url)
			stall := newStallDialer(prefix + "{jobHeld}:deltas")
			rdb := stallClient(t, url, stall)
			buf := deltastream.New(deltastream.Config{Redis: rdb, Prefix: prefix})
			hub := buf.NewHub()
			defer hub.Close()
			ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
			defer cancel()
			fast := hub.Follow(ctx, "jobLive")
			defer fast.Stop()
			defer stall.unstall() // first: the held write holds the connection
			heldFollowed := make(chan *deltastream.Follower, 1)
			go func() { heldFollowed <- hub.Follow(ctx, "jobHeld") }()
			select {
			case <-stall.entered:
			case <-ctx.Done():
				t.Fatal("the subscription to jobHeld was never sent")
			}

			w := buf.Writer("jobLive", 2, 1)
			var got []deltastream.Entry
			for i, text := range []string{"while", " held"} {
				w.Add(deltastream.Delta{Type: "text", Index: i, Text: text}) // a block each: one entry each
				for len(got) < i+1 {
					awaitWake(t, fast.Wake())
					var last deltastream.Entry
					if len(got) > 0 {
						last = got[len(got)-1]
					}
					entries, ok := fast.Next(last)
					require.True(t, ok, "the entries received follow the last one read (%d so far)", len(got))
					got = append(got, entries...)
				}
			}
			w.Close(ctx)
			read, err := buf.Read(ctx, "jobLive", "", 10)
			require.NoError(t, err)
			require.Equal(t, read, got, "every entry written, in order, once")

			stall.unstall()
			var held *deltastream.Follower
			select {
			case held = <-heldFollowed:
			case <-ctx.Done():
				t.Fatal("the Follow of jobHeld did not return once its subscription went through")
			}
			defer held.Stop()
			require.Eventually(t, func() bool {
				n, err := redistest.NumSub(ctx, rdb, buf.Key("jobHeld"))
				return err == nil && n == 1
			}, 30*time.Second, 5*time.Millisecond, "jobHeld is not subscribed")
			hw := buf.Writer("jobHeld", 2, 1)
			hw.Add(deltastream.Delta{Type: "text", Text: "x"})
			awaitWake(t, held.Wake())
			entries, ok := held.Next(deltastream.Entry{})
			if !ok {
				// Its Follow may have given up waiting (2 s) on a slow machine: read the buffer.
				entries, err = buf.Read(ctx, "jobHeld", "", 10)
				require.NoError(t, err)
			}
			require.Len(t, entries, 1)
			hw.Close(ctx)
		})
	}
}

// TestHub_AWriteHeldPastItsDeadlineConnectsAgain: a subscription's write held past its deadline
// fails the hub's connection, as it did when go-redis wrote it itself; the jobs followed are
// delivered to until then, and after it the hub connects and subscribes again, each follower
// is told to read the buffer, and no entry is lost or received twice.
func TestHub_AWriteHeldPastItsDeadlineConnectsAgain(t *testing.T) {
	t.Parallel()
	prefix := redistest.Prefix(t)
	opts, err := redis.ParseURL(redistest.URL())
	require.NoError(t, err)
	opts.WriteTimeout = 500 * time.Millisecond
	stall := newStallDialer(prefix + "{jobHeld}:deltas")
	stall.expire = true
	opts.Dialer = stall.dial
	rdb := redis.NewClient(opts)
	t.Cleanup(func() { _ = rdb.Close() })
	buf := deltastream.New(deltastream.Config{Redis: rdb, Prefix: prefix})
	hub := buf.NewHub()
	defer hub.Close()
	defer stall.unstall()
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()

	live := hub.Follow(ctx, "jobLive")
	defer live.Stop()
	heldFollowed := make(chan *deltastream.Follower, 1)
	go func() { heldFollowed <- hub.Follow(ctx, "jobHeld") }()
	select {
	case <-stall.entered:
	case <-ctx.Done():
		t.Fatal("the subscription to jobHeld was never sent")
	}
	w := buf.Writer("jobLive", 2, 1)
	defer w.Close(ctx)
	w.Add(deltastream.Delta{Type: "text", Index: 0, Text: "held"})
	awaitWake(t, live.Wake())
	got, ok := live.Next(deltastream.Entry{})
	require.True(t, ok)
	require.Len(t, got, 1)

	// The write fails at its deadline: the hub connects again, and says to read the buffer.
	awaitWake(t, live.Wake())
	_, ok = live.Next(got[0])
	require.False(t, ok, "connected again: a batch may have been lost")
	read, err := buf.Read(ctx, "jobLive", got[0].ID, 10)
	require.NoError(t, err)
	got = append(got, read...)
	w.Add(deltastream.Delta{Type: "text", Index: 1, Text: "after"})
	for len(got) < 2 {
		awaitWake(t, live.Wake())
		entries, ok := live.Next(got[len(got)-1])
		require.True(t, ok)
		got = append(got, entries...)
	}
	all, err := buf.Read(ctx, "jobLive", "", 10)
	require.NoError(t, err)
	require.Equal(t, all, got, "every entry, in order, once")

	var held *deltastream.Follower
	select {
	case held = <-heldFollowed:
	case <-ctx.Done():
		t.Fatal("the Follow of jobHeld did not return")
	}
	defer held.Stop()
	require.Eventually(t, func() bool {
		n, err := redistest.NumSub(ctx, rdb, buf.Key("jobHeld"))
		return err == nil && n == 1
	}, 30*time.Second, 5*time.Millisecond, "jobHeld is not subscribed")
	hw := buf.Writer("jobHeld", 2, 1)
	defer hw.Close(ctx)
	hw.Add(deltastream.Delta{Type: "text", Text: "x"})
	awaitWake(t, held.Wake())
	entries, ok := held.Next(deltastream.Entry{})
	if !ok {
		entries, err = buf.Read(ctx, "jobHeld", "", 10)
		require.NoError(t, err)
	}
	require.Len(t, entries, 1)
}

// slowLinkConn is a connection on a link slower to take a big write than Go is to copy it (any
// network but a loopback one): each write of more than 4 KiB takes 5 ms.
type slowLinkConn struct{ net.Conn }

func (c slowLinkConn) Write(p []byte) (int, error) {
	if len(p) > 4<<10 {
		<-time.After(5 * time.Millisecond)
	}
	return c.Conn.Write(p)
}

// TestHub_ALargeResubscriptionGoesThrough: after a reconnect go-redis subscribes the new
// connection to every channel followed in one command; one larger than the bytes the hub's
// connection lets wait (tens of thousands of jobs followed; here fewer, with long IDs) goes
// through a slow link, and the followers are told to read the buffer and receive again, where
// failing the connection at the bound failed every resubscription, and the hub connected again
// and again, subscribed to nothing.
func TestHub_ALargeResubscriptionGoesThrough(t *testing.T) {
	t.Parallel()
	opts, err := redis.ParseURL(redistest.URL())
	require.NoError(t, err)
	opts.ClientName = "hub-large-resubscribe-" + redistest.Rand()
	opts.Dialer = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return slowLinkConn{c}, nil
	}
	rdb := redis.NewClient(opts)
	t.Cleanup(func() { _ = rdb.Close() })
	buf := deltastream.New(deltastream.Config{Redis: rdb, Prefix: redistest.Prefix(t)})
	hub := buf.NewHub()
	defer hub.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	var ids []string
	for i := range 64 { // 64 channels of 20 KB: 1.3 MB to resubscribe
		ids = append(ids, strings.Repeat("j", 20_000)+strconv.Itoa(i))
	}
	for _, id := range ids {
		f := hub.Follow(ctx, id)
		defer f.Stop()
	}
	f := hub.Follow(ctx, "jobR")
	defer f.Stop()

	admin := redistest.Client(t)
	list, err := admin.ClientList(ctx).Result()
	require.NoError(t, err)
	killed := 0
	for line := range strings.SplitSeq(list, "\n") {
		if !strings.Contains(line, " name="+opts.ClientName+" ") || strings.Contains(line, " sub=0 ") {
			continue
		}
		id := strings.TrimPrefix(strings.Fields(line)[0], "id=")
		n, err := admin.ClientKillByFilter(ctx, "ID", id).Result()
		require.NoError(t, err)
		killed += int(n)
	}
	require.Equal(t, 1, killed, "the hub's one Pub/Sub connection, in:\n%s", list)

	awaitWake(t, f.Wake()) // the resubscription's confirmation
	_, ok := f.Next(deltastream.Entry{})
	require.False(t, ok, "after the resubscription a batch may be missing: read the buffer")
	w := buf.Writer("jobR", 2, 1)
	defer w.Close(ctx)
	w.Add(deltastream.Delta{Type: "text", Text: "after"})
	awaitWake(t, f.Wake())
	entries, ok := f.Next(deltastream.Entry{})
	require.True(t, ok, "the subscription is live again")
	require.Len(t, entries, 1)
}
