package console

import (
	"context"
	"crypto/sha256"
	"net/http"
	"sync"
	"time"
)

// DefaultLookupWait is Config.LookupWait's default: the API's wait for a pool connection
// (api.StoreWait's default).
const DefaultLookupWait = 5 * time.Second

// maxKnownSessions caps the session tokens a lookupGate remembers as live: past it, they are
// forgotten all at once (each then takes a place once more, at its next request).
const maxKnownSessions = 10_000

// lookupGate caps the console's lookups in Postgres of credentials that anybody can make up: the
// operator tokens of logins, and the session cookies this process has neither opened nor found
// live. Each is a statement on a connection of the pool the API shares, sent before anything
// says who the client is: without a cap, a client with no credentials (made-up cookies, or
// logins) held as many connections as it had requests in flight, each as long as Postgres took
// to answer, and every tenant's submits, polls and cancels waited behind them until their bound
// (503 overloaded). A session cookie opened by this process's login, or found live once, is
// looked up again without a place: those are an operator's, one lookup a request, as before. It
// is safe for concurrent use.
type lookupGate struct {
	places chan struct{}
	wait   time.Duration
	mu     sync.Mutex
	// known are the SHA-256 of the session tokens found live, whatever has become of them since
	// (their lookup answers that).
	known map[[32]byte]struct{}
}

// newLookupGate returns a gate of places lookups at once (at least 1), each waiting at most wait
// for a place.
func newLookupGate(places int, wait time.Duration) *lookupGate {
	return &lookupGate{places: make(chan struct{}, max(1, places)), wait: wait, known: map[[32]byte]struct{}{}}
}

// errLookupsFull is the 503 of a lookup that found no place within the gate's wait.
var errLookupsFull = &apiError{status: http.StatusServiceUnavailable, typ: "overloaded", message: "the lookups of console credentials hold their share of the database connections; retry shortly"}

// enter takes a place for the lookup of a credential, unless it is a session token found live
// before (session true and known), waiting at most the gate's wait (then errLookupsFull) or
// ctx's end. Call release once the lookup is over.
func (g *lookupGate) enter(ctx context.Context, session bool, token string) (release func(), err error) {
	if session && g.isKnown(token) {
		return func() {}, nil
	}
	release = func() { <-g.places }
	select {
	case g.places <- struct{}{}:
		return release, nil
	default:
	}
	t := time.NewTimer(g.wait)
	defer t.Stop()
	select {
	case g.places <- struct{}{}:
		return release, nil
	case <-t.C:
		return nil, errLookupsFull
	case <-ctx.Done():
		return nil, context.Cause(ctx)
	}
}

func (g *lookupGate) isKnown(token string) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	_, ok := g.known[sha256.Sum256([]byte(token))]
	return ok
}

// found records whether the session token's lookup found it live: a live one is known from now
// on, another forgotten.
func (g *lookupGate) found(token string, live bool) {
	key := sha256.Sum256([]byte(token))
	g.mu.Lock()
	defer g.mu.Unlock()
	if !live {
		delete(g.known, key)
		return
	}
	if _, ok := g.known[key]; !ok && len(g.known) >= maxKnownSessions {
		clear(g.known)
	}
	g.known[key] = struct{}{}
}
