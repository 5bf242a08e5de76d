package tenant

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// WeightCacheTTL is how long Weights keeps a tenant's weight: `ctl tenants set --weight` reaches
// every worker within it.
const WeightCacheTTL = 10 * time.Second

// Weights answers tenants' weights from the Store, each kept WeightCacheTTL, so that the workers'
// admission of every attempt does not read Postgres; and, from the same reads, whether the
// deployment has a single tenant (Single). Safe for concurrent use.
type Weights struct {
	store *Store
	now   func() time.Time
	mu    sync.Mutex
	m     map[string]cachedWeight
	// several is what the last read of the Store said: 0 nothing read yet, 1 a single tenant,
	// 2 several.
	several atomic.Int32
}

type cachedWeight struct {
	w   int
	exp time.Time
}

// NewWeights returns a cache over store; now is its clock (nil: time.Now).
func NewWeights(store *Store, now func() time.Time) *Weights {
	if now == nil {
		now = time.Now
	}
	return &Weights{store: store, now: now, m: map[string]cachedWeight{}}
}

// Weight returns the tenant's weight (DefaultWeight for a name with no row), from the cache while
// fresh. Errors: Store.Weight's, when the cache holds nothing fresh.
func (c *Weights) Weight(ctx context.Context, name string) (int, error) {
	if w, ok := c.Cached(name); ok {
		return w, nil
	}
	now := c.now()
	w, several, err := c.store.weightAmong(ctx, name)
	if err != nil {
		return 0, err
	}
	if several {
		c.several.Store(2)
	} else {
		c.several.Store(1)
	}
	c.mu.Lock()
	if len(c.m) > 100_000 {
		clear(c.m) // tenants are few; a bound all the same
	}
	c.m[name] = cachedWeight{w: w, exp: now.Add(WeightCacheTTL)}
	c.mu.Unlock()
	return w, nil
}

// Cached returns the tenant's weight if the cache holds it fresh, without reading the Store:
// for a caller that must not wait on Postgres (a first attempt's admission inside the job's
// insert transaction). ok is false when it does not; Weight then reads it.
func (c *Weights) Cached(name string) (w int, ok bool) {
	now := c.now()
	c.mu.Lock()
	e, found := c.m[name]
	c.mu.Unlock()
	if !found || !now.Before(e.exp) {
		return 0, false
	}
	return e.w, true
}

// Single reports whether the deployment has a single tenant, as the last read of a weight from
// the Store found it (at most WeightCacheTTL old while jobs are delivered): no tenant stored but
// Default (the anonymous requests'), revoked ones aside. One named tenant counts as several,
// since anonymous requests may come beside its. False until a weight was read.
func (c *Weights) Single() bool { return c.several.Load() == 1 }
