package tenant

import (
	"context"
	"errors"
	"sync"
	"time"
)

// AuthenticatorConfig configures an Authenticator. Zero fields take their defaults.
type AuthenticatorConfig struct {
	// TTL is how long a lookup's answer is reused: the delay before a revocation (or a tenant's
	// new credential list) takes effect on a replica that cached the token. Default 2s.
	TTL time.Duration
	// MaxEntries caps the cache, so that a flood of random tokens cannot grow it without bound.
	// Default 10000.
	MaxEntries int
	// Now is the clock. Default time.Now.
	Now func() time.Time
}

// Authenticator resolves bearer tokens to tenants through a Store, caching each answer (known,
// revoked or unknown) for a short TTL. Database errors are not cached. Safe for concurrent use.
//
// Caching unknown tokens is safe: a token becomes known only by Store.Create, which makes a fresh
// random one that nobody can have presented before.
type Authenticator struct {
	store *Store
	cfg   AuthenticatorConfig

	mu      sync.Mutex
	entries map[[32]byte]entry
	// named caches Named's answers, by tenant name.
	named map[string]entry
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
		c.TTL = 2 * time.Second
	}
	if c.MaxEntries == 0 {
		c.MaxEntries = 10000
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	return &Authenticator{store: store, cfg: c, entries: map[[32]byte]entry{}, named: map[string]entry{}}
}

// TTL is how long an answer is cached: the longest a revocation takes to reach this process.
func (a *Authenticator) TTL() time.Duration { return a.cfg.TTL }

// Authenticate returns the token's tenant. Errors: ErrMalformedBearerToken, ErrUnknownBearerToken,
// ErrRevoked (returned with the tenant), or a wrapped database error (not cached).
func (a *Authenticator) Authenticate(ctx context.Context, token string) (*Tenant, error) {
	hash, err := HashBearerToken(token)
	if err != nil {
		return nil, err
	}
	return cached(ctx, a, a.entries, hash, func(ctx context.Context) (*Tenant, error) {
		t, err := a.store.Lookup(ctx, hash)
		if errors.Is(err, ErrUnknownBearerToken) {
			return nil, errAnswer{err}
		}
		return t, err
	})
}

// Named returns the tenant of that name as stored, for a request that names it without a token
// (the anonymous tenant Default): with no stored tenant of that name, a tenant of that name that
// may use every credential, of DefaultWeight. The answer is cached for the TTL as Authenticate's
// are. Errors: ErrRevoked (returned with the tenant), or a wrapped database error (not cached).
func (a *Authenticator) Named(ctx context.Context, name string) (*Tenant, error) {
	return cached(ctx, a, a.named, name, func(ctx context.Context) (*Tenant, error) {
		t, err := a.store.Get(ctx, name)
		if errors.Is(err, ErrNotFound) {
			return &Tenant{Name: name, Weight: DefaultWeight}, nil
		}
		return t, err
	})
}

// errAnswer wraps an error that is an answer (cached as one), not a failure of the lookup.
type errAnswer struct{ error }

func (e errAnswer) Unwrap() error { return e.error }

// cached returns the lookup of key in cache: the cached answer while it is fresh, else load's,
// which it caches for the TTL when it is an answer (a tenant, ErrRevoked for a revoked one, or
// an errAnswer), not a failure (a database error, returned and not cached).
func cached[K comparable](ctx context.Context, a *Authenticator, cache map[K]entry, key K,
	load func(context.Context) (*Tenant, error)) (*Tenant, error) {
	now := a.cfg.Now()
	a.mu.Lock()
	e, ok := cache[key]
	a.mu.Unlock()
	if ok && now.Before(e.expires) {
		return e.tenant, e.err
	}
	t, err := load(ctx)
	var answer errAnswer
	switch {
	case errors.As(err, &answer):
		err = answer.error
	case err != nil:
		return nil, err
	case t.Revoked():
		err = ErrRevoked
	}
	put(a, cache, key, entry{tenant: t, err: err, expires: now.Add(a.cfg.TTL)})
	return t, err
}

// put stores an answer in cache, making room first when it is full: expired entries go, and
// if that is not enough, all of them. Simpler than an LRU; the cost of a full clear is one lookup
// per live key, and it takes a flood of distinct tokens within one TTL to get there.
func put[K comparable](a *Authenticator, cache map[K]entry, key K, e entry) {
	a.mu.Lock()
	defer a.mu.Unlock()
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
