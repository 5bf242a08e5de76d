package tenant

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/llmq/llmq/internal/pgwait"
)

// DefaultCacheTTL is how long an Authenticator reuses a lookup's answer unless configured
// otherwise (the API's): the longest a revocation takes to reach an API replica.
const DefaultCacheTTL = 2 * time.Second

// AuthenticatorConfig configures an Authenticator. Zero fields take their defaults.
type AuthenticatorConfig struct {
	// TTL is how long a lookup's answer is reused: the delay before a revocation (or a tenant's
	// new credential list) takes effect on a replica that cached the token. Default
	// DefaultCacheTTL.
	TTL time.Duration
	// MaxEntries caps the cache, so that a flood of random tokens cannot grow it without bound:
	// the answers for known tokens (and tenant names) and, apart, those for unknown tokens, each
	// up to MaxEntries, so that unknown tokens cannot evict known ones. Default 10000.
	MaxEntries int
	// MaxNewTokenLookups caps the lookups under way at once of bearer tokens this Authenticator
	// has never known as a tenant's (never seen, or answered unknown before): those anybody can
	// send, made up, each new one a Postgres round trip on a pool connection before any tenant's
	// limit applies. Past it a lookup waits for a place, as long as it would wait for a pool
	// connection (its pgwait bound, which then ends it: the API's 503 overloaded, nothing sent).
	// A token known as a tenant's, its answer expired or not, is looked up again without a place:
	// those lookups are one per known token and TTL at most. Default a quarter of the store's
	// pool's connections, at least 1.
	MaxNewTokenLookups int
	// Now is the clock. Default time.Now.
	Now func() time.Time
}

// Authenticator resolves bearer tokens to tenants through a Store, caching each answer (known,
// revoked or unknown) for a short TTL. Database errors are not cached. Safe for concurrent use.
//
// Caching unknown tokens is safe: a token becomes known only by Store.Create or Store.Rotate,
// which make a fresh random one that nobody can have presented before.
//
// The lookups of tokens it has never known as a tenant's take a place of their own first
// (AuthenticatorConfig.MaxNewTokenLookups), so that a client sending made-up tokens, each a
// miss, holds at most those connections of the pool, not every one.
type Authenticator struct {
	store *Store
	cfg   AuthenticatorConfig

	mu sync.Mutex
	// entries are the answers for known tokens (a tenant, revoked or not); unknown those for
	// unknown ones, which anyone can send without a token, capped apart (see put).
	entries map[[32]byte]entry
	unknown map[[32]byte]entry
	// named caches Named's answers, by tenant name.
	named map[string]entry
	// flights are the lookups under way, by key (a token's hash or a name: keys of different
	// types never collide), which a concurrent miss of the same key waits for (see cached).
	flights map[any]*flight
	// joined counts the callers waiting for another's lookup (tests).
	joined int
	// newLookups holds a token for each lookup under way of a token not known as a tenant's
	// (MaxNewTokenLookups).
	newLookups chan struct{}
}

// flight is one lookup under way; done is closed once its answer is cached (or it failed).
type flight struct {
	done chan struct{}
	// bounded: the looking caller's wait for a connection has a pgwait bound.
	bounded bool
	// capped: the key is a token not known as a tenant's; its lookup takes a place of
	// newLookups first.
	capped bool
	answer bool // the lookup answered (cached), rather than failed
	// err is a failure the waiters share: the database's, not the end of the looking caller's
	// context (its client left), after which each waiter tries itself.
	err error
}

type entry struct {
	tenant  *Tenant
	err     error // nil, ErrUnknownBearerToken or ErrRevoked
	expires time.Time
}

// NewAuthenticator returns an Authenticator over store. cfg may be nil.
func NewAuthenticator(store *Store, cfg *AuthenticatorConfig) *Authenticator {
	var c AuthenticatorConfig
	if cfg != nil {
		c = *cfg
	}
	if c.TTL == 0 {
		c.TTL = DefaultCacheTTL
	}
	if c.MaxEntries == 0 {
		c.MaxEntries = 10000
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.MaxNewTokenLookups <= 0 {
		c.MaxNewTokenLookups = 1
		if store != nil && store.pool != nil {
			c.MaxNewTokenLookups = max(1, int(store.pool.Config().MaxConns)/4)
		}
	}
	return &Authenticator{store: store, cfg: c, entries: map[[32]byte]entry{}, unknown: map[[32]byte]entry{}, named: map[string]entry{},
		flights: map[any]*flight{}, newLookups: make(chan struct{}, c.MaxNewTokenLookups)}
}

// ErrNewTokenLookupsFull is the failure of a lookup of a token never known as a tenant's that
// found no place among those lookups (AuthenticatorConfig.MaxNewTokenLookups) within its pgwait
// bound. It comes wrapped with pgwait.ErrTimeout (the API's 503 overloaded): a client sending
// made-up tokens, or a burst of new ones, holds the lookups' share of the pool.
var ErrNewTokenLookupsFull = errors.New("the lookups of bearer tokens never known hold their share of the pool")

// TTL is how long an answer is cached: the longest a revocation takes to reach this process.
func (a *Authenticator) TTL() time.Duration { return a.cfg.TTL }

// Authenticate returns the token's tenant. Errors: ErrMalformedBearerToken, ErrUnknownBearerToken,
// ErrRevoked or ErrRotatedOut (returned with the tenant), or a wrapped database error (not
// cached). A token that a rotation replaced is answered as its tenant's no later than the end of
// the rotation's overlap, whatever the TTL; a rotation with no overlap reaches this process
// within the TTL.
func (a *Authenticator) Authenticate(ctx context.Context, token string) (*Tenant, error) {
	hash, err := HashBearerToken(token)
	if err != nil {
		return nil, err
	}
	return cached(ctx, a, a.entries, a.unknown, hash, func(ctx context.Context) (*Tenant, error) {
		t, err := a.store.Lookup(ctx, hash)
		switch {
		case errors.Is(err, ErrUnknownBearerToken):
			return nil, errAnswer{err}
		case errors.Is(err, ErrRotatedOut):
			return t, errAnswer{err}
		}
		return t, err
	})
}

// Named returns the tenant of that name as stored, for a request that names it without a token
// (the anonymous tenant Default): with no stored tenant of that name, a tenant of that name that
// may use every credential, of DefaultWeight. The answer is cached for the TTL as Authenticate's
// are. Errors: ErrRevoked (returned with the tenant), or a wrapped database error (not cached).
func (a *Authenticator) Named(ctx context.Context, name string) (*Tenant, error) {
	return cached(ctx, a, a.named, nil, name, func(ctx context.Context) (*Tenant, error) {
		t, err := a.store.Get(ctx, name)
		if errors.Is(err, ErrNotFound) {
			return &Tenant{Name: name, Weight: DefaultWeight}, nil
		}
		return t, err
	})
}

// ErrNotCached is Cached's and CachedNamed's answer when the cache holds no fresh answer: the
// lookup (Authenticate's, Named's) goes to Postgres, or waits for one under way.
var ErrNotCached = errors.New("no fresh answer cached")

// Cached returns Authenticate's answer for token when it is at hand, without a lookup: a
// malformed token's ErrMalformedBearerToken, or the cached answer while it is fresh (on the
// same clock, so the same revocation and rotation delays): the tenant, or ErrUnknownBearerToken,
// ErrRevoked or ErrRotatedOut (the latter two with the tenant). Else ErrNotCached, for a caller
// that bounds a lookup's waits only when it makes one (the API's StoreTimeout). It never waits
// on Postgres nor on a lookup under way.
func (a *Authenticator) Cached(token string) (*Tenant, error) {
	hash, err := HashBearerToken(token)
	if err != nil {
		return nil, err
	}
	return fresh(a, a.entries, a.unknown, hash)
}

// CachedNamed returns Named's answer for name when the cache holds it fresh (see Cached), else
// ErrNotCached.
func (a *Authenticator) CachedNamed(name string) (*Tenant, error) {
	return fresh(a, a.named, nil, name)
}

// fresh is cached's answer for key when cache (or unknown) holds it fresh, else ErrNotCached.
func fresh[K comparable](a *Authenticator, cache, unknown map[K]entry, key K) (*Tenant, error) {
	now := a.cfg.Now()
	a.mu.Lock()
	e, ok := freshEntry(cache, unknown, key, now)
	a.mu.Unlock()
	if !ok {
		return nil, ErrNotCached
	}
	return e.tenant, e.err
}

// freshEntry is key's answer in cache, or else in unknown, when it has not expired by now. The
// caller holds a.mu.
func freshEntry[K comparable](cache, unknown map[K]entry, key K, now time.Time) (entry, bool) {
	if e, ok := cache[key]; ok && now.Before(e.expires) {
		return e, true
	}
	if e, ok := unknown[key]; ok && now.Before(e.expires) {
		return e, true
	}
	return entry{}, false
}

// errAnswer wraps an error that is an answer (cached as one), not a failure of the lookup.
type errAnswer struct{ error }

func (e errAnswer) Unwrap() error { return e.error }

// cached returns the lookup of key in cache: the cached answer while it is fresh, else load's,
// which it caches for the TTL when it is an answer (a tenant, ErrRevoked for a revoked one, or
// an errAnswer), not a failure (a database error, returned and not cached). With unknown not
// nil, ErrUnknownBearerToken answers are cached there instead, apart (see put).
//
// One lookup per key at a time: a miss while another caller looks the key up waits for that
// lookup's answer (or its own context's end) instead of running one more, so a burst of requests
// with a token that is not cached (after a start, or each time its TTL ends under load) costs one
// Postgres round trip, not one per request, each taking a pool connection ahead of the requests'
// own statements. A failure of that lookup is shared too (Postgres unreachable, or no pool
// connection free in time: see pgwait, shared only with the waiters that have a bound), except
// the end of its caller's context by its caller (canceled, or its deadline), after which each
// waiter tries again itself. A waiter with a bound waits for a lookup without one at most its
// bound (see waitFlight). The lookup of a token with no answer in the known tokens' cache
// (expired or not) waits for a place among the new tokens' lookups first (newLookupPlace), as
// part of the flight: the callers of the same token wait with it.
func cached[K comparable](ctx context.Context, a *Authenticator, cache, unknown map[K]entry, key K,
	load func(context.Context) (*Tenant, error)) (*Tenant, error) {
	for {
		now := a.cfg.Now()
		a.mu.Lock()
		if e, ok := freshEntry(cache, unknown, key, now); ok {
			a.mu.Unlock()
			return e.tenant, e.err
		}
		_, known := cache[key]
		f, busy := a.flights[key]
		_, bounded := pgwait.Wait(ctx)
		if !busy {
			// A token with no answer in cache, fresh or expired, is not known as a tenant's.
			f = &flight{done: make(chan struct{}), bounded: bounded, capped: unknown != nil && !known}
			a.flights[key] = f
			a.mu.Unlock()
			return lookup(ctx, a, cache, unknown, key, f, now, load)
		}
		a.joined++
		a.mu.Unlock()
		waitFlight(ctx, f, bounded)
		a.mu.Lock()
		a.joined--
		a.mu.Unlock()
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		if f.err != nil && (bounded || !errors.Is(f.err, pgwait.ErrTimeout)) {
			// A bound's failure is shared by the callers that have one only: one without (an
			// event stream) waits for its connection as long as it waits, so it tries itself.
			return nil, f.err
		}
		if f.answer {
			// Cached by the lookup, fresh whatever the clock says now (unless a full cache was
			// cleared since: then look again).
			a.mu.Lock()
			e, ok := cache[key]
			if !ok {
				e, ok = unknown[key]
			}
			a.mu.Unlock()
			if ok {
				return e.tenant, e.err
			}
		}
	}
}

// newLookupPlace takes a place among the lookups of tokens not known as a tenant's
// (MaxNewTokenLookups), waiting for one as for a pool connection: at most ctx's pgwait bound,
// past which ctx is ended by it (pgwait.Expire) and the error wraps ErrNewTokenLookupsFull and
// pgwait.ErrTimeout, or until ctx's end. Call release once the lookup is over.
func (a *Authenticator) newLookupPlace(ctx context.Context) (release func(), err error) {
	release = func() { <-a.newLookups }
	select {
	case a.newLookups <- struct{}{}:
		return release, nil
	default:
	}
	var expired <-chan time.Time
	if wait, ok := pgwait.Wait(ctx); ok {
		t := time.NewTimer(wait)
		defer t.Stop()
		expired = t.C
	}
	select {
	case a.newLookups <- struct{}{}:
		return release, nil
	case <-ctx.Done():
		return nil, fmt.Errorf("look up bearer token: %w", context.Cause(ctx))
	case <-expired:
		pgwait.Expire(ctx)
		return nil, fmt.Errorf("look up bearer token: %w: %w", ErrNewTokenLookupsFull, pgwait.ErrTimeout)
	}
}

// waitFlight waits for f's end, or ctx's. A caller with a pgwait bound waiting for a lookup
// without one (an event stream's) waits at most its bound, as for a connection of its own: past
// it, ctx is ended by its bound (pgwait.Expire). A bounded lookup ends within its own bound.
func waitFlight(ctx context.Context, f *flight, bounded bool) {
	var expired <-chan time.Time
	if bounded && !f.bounded {
		wait, _ := pgwait.Wait(ctx)
		t := time.NewTimer(wait)
		defer t.Stop()
		expired = t.C
	}
	select {
	case <-f.done:
	case <-ctx.Done():
	case <-expired:
		pgwait.Expire(ctx)
	}
}

// lookup runs load for key as the flight f, caches its answer (not a failure; in unknown when
// it is ErrUnknownBearerToken and unknown is not nil, else in cache) and ends f.
func lookup[K comparable](ctx context.Context, a *Authenticator, cache, unknown map[K]entry, key K, f *flight, now time.Time,
	load func(context.Context) (*Tenant, error)) (*Tenant, error) {
	answered := false
	var shared error
	defer func() {
		a.mu.Lock()
		delete(a.flights, key)
		f.answer, f.err = answered, shared
		a.mu.Unlock()
		close(f.done)
	}()
	if f.capped {
		inner := load
		load = func(ctx context.Context) (*Tenant, error) {
			release, err := a.newLookupPlace(ctx)
			if err != nil {
				return nil, err
			}
			defer release()
			return inner(ctx)
		}
	}
	t, err := load(ctx)
	var answer errAnswer
	switch {
	case errors.As(err, &answer):
		err = answer.error
	case err != nil:
		switch cause := context.Cause(ctx); {
		case cause == nil:
			shared = err
		case !errors.Is(cause, context.Canceled) && !errors.Is(cause, context.DeadlineExceeded):
			// Ended by something else than its caller leaving (a pgwait bound): the waiters
			// would meet it too.
			shared = fmt.Errorf("%w: %w", err, cause)
		}
		return nil, err
	case t.Revoked():
		err = ErrRevoked
	}
	into, other := cache, unknown
	if unknown != nil && errors.Is(err, ErrUnknownBearerToken) {
		into, other = unknown, cache
	}
	expires := now.Add(a.cfg.TTL)
	if err == nil && t.replaced && t.tokenLeft < a.cfg.TTL {
		// A replaced token in its overlap: not past the overlap's end (now is from before the
		// lookup, so this errs early, whatever this process's clock is against Postgres's).
		expires = now.Add(t.tokenLeft)
	}
	put(a, into, other, key, entry{tenant: t, err: err, expires: expires})
	answered = true
	return t, err
}

// put stores an answer in cache (and drops key's from other, the other cache of its kind of
// key), making room first when it is full: expired entries go, and if that is not enough, all of
// them. Simpler than an LRU; the cost of a full clear is one lookup per live key, and it takes a
// flood of distinct keys within one TTL to get there. Answers for unknown tokens, the ones
// anybody can make up, fill a cache of their own: a flood of them clears only that one.
func put[K comparable](a *Authenticator, cache, other map[K]entry, key K, e entry) {
	a.mu.Lock()
	defer a.mu.Unlock()
	delete(other, key)
	if len(cache) >= a.cfg.MaxEntries {
		now := a.cfg.Now()
		for k, v := range cache {
			if !now.Before(v.expires) {
				delete(cache, k)
			}
		}
		if len(cache) >= a.cfg.MaxEntries {
			clear(cache)
		}
	}
	cache[key] = e
}
