package jobs

import (
	"context"
	"fmt"
	"log/slog"
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
}

// DefaultListenerPingInterval is ListenerConfig.PingInterval's default: a silent connection is
// replaced within 20 s, about when an event stream's keep-alive re-read (15 s) would have caught
// up on the transitions it missed anyway; a ping every 10 s of quiet is nothing to Postgres.
const DefaultListenerPingInterval = 10 * time.Second

// Listener fans the job transitions announced on EventsChannel out to in-process subscribers
// (the SSE streams of one API process) over a single Postgres connection, however many
// subscribers there are. Because the notifications come from Postgres, it sees transitions made
// by any process: workers, other API replicas, ctl.
//
// Notifications are lost while the connection is down; after every (re)connection each
// subscriber is signalled with 0, so it re-reads the job's events from the table and misses
// nothing. The zero value is not usable; use NewListener. Safe for concurrent use.
type Listener struct {
	cfg ListenerConfig

	mu   sync.Mutex
	subs map[string]map[chan int]struct{}
	n    int
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
	return &Listener{cfg: cfg, subs: map[string]map[chan int]struct{}{}}
}

// Subscribe registers interest in one job's transitions. The channel receives the sequence number
// of a transition that committed, or 0 after the listener (re)connected. Signals coalesce (the
// channel holds one and further ones are dropped while it is full), so a value is only a hint:
// on every receive, re-read the job's events after the last one handled. Subscribe before the
// first read so that nothing committed after that read goes unsignalled. cancel unsubscribes; it
// is idempotent and must be called (the channel is never closed).
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
	if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{EventsChannel}.Sanitize()); err != nil {
		return false, fmt.Errorf("listen: %w", err)
	}
	// Everything committed from now on is announced to us; whatever committed while we were not
	// listening is recovered by the subscribers' re-read.
	l.broadcast()
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

func (l *Listener) broadcast() {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, set := range l.subs {
		for ch := range set {
			send(ch, 0)
		}
	}
}

// send delivers v unless a signal is already pending (the pending one triggers the same re-read).
func send(ch chan int, v int) {
	select {
	case ch <- v:
	default:
	}
}
