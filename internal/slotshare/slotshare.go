// Package slotshare shares a worker process's delivery slots between tenants by weight.
//
// asynq hands a process's slots (worker.concurrency) to the pending tasks first come first
// served, and a delivery that waits for a send slot gives its slot back, so only calls in
// flight hold one: without a rule, one tenant's long calls could hold every slot while another
// tenant's jobs wait behind them in the pending list. A Tracker counts, per tenant, the
// deliveries that hold a slot and the tenants it turned away lately (they have work waiting),
// and answers whether one more delivery of a tenant may take a slot:
//   - while more than Reserve slots are free, any tenant may take one: the shares below bind only
//     when slots are scarce, so slots are never left idle for a share a tenant with nothing
//     waiting does not use (a tenant holding a few slots and asking for no more);
//   - alone (no other tenant holding a slot or turned away lately), a tenant may hold
//     Slots - Reserve, so that another tenant's task behind its backlog is delivered and seen;
//     in a deployment of a single tenant (Take's single), all Slots: the reserve costs nothing;
//   - with others active, about Slots × w / Σw over the active tenants, at least 1, at most
//     Slots - Reserve.
//
// A delivery turned away is to come back after the delay Take returns, which doubles (from
// MinDelay to MaxDelay, jittered) while the tenant's deliveries keep being turned away.
package slotshare

import (
	"sync"
	"time"
)

// Defaults of Config.
const (
	// DefaultMinDelay is Config.MinDelay's default: the first deferral's delay.
	DefaultMinDelay = 100 * time.Millisecond
	// DefaultMaxDelay is Config.MaxDelay's default: the longest deferral's delay.
	DefaultMaxDelay = 2 * time.Second
	// DefaultWaiting is Config.Waiting's default: longer than a deferral's delay plus asynq's
	// rounding of its time to the second, so that a tenant turned away counts as waiting until
	// its deliveries come back.
	DefaultWaiting = 5 * time.Second
	// DefaultForget is Config.Forget's default.
	DefaultForget = time.Minute
)

// Config configures a Tracker.
type Config struct {
	// Slots is how many deliveries the process runs at once (worker.concurrency). Required.
	Slots int
	// Reserve is how many slots a tenant alone leaves free in a deployment of several tenants.
	// Default max(1, Slots/50); at most Slots-1.
	Reserve int
	// MinDelay is the delay of a tenant's first delivery turned away. Default DefaultMinDelay.
	MinDelay time.Duration
	// MaxDelay caps the delay as it doubles. Default DefaultMaxDelay.
	MaxDelay time.Duration
	// Waiting is how long a tenant turned away counts as active (with work waiting) after it
	// was last turned away. Default DefaultWaiting.
	Waiting time.Duration
	// Forget is how long a tenant neither holding a slot nor waiting is kept (with its weight
	// and its deferrals' count) before it is dropped. Default DefaultForget.
	Forget time.Duration
	// Now is the clock. Default time.Now.
	Now func() time.Time
	// Float64 returns a random number in [0,1) that spreads the delays. Default: none (0).
	Float64 func() float64
}

// Tracker shares a process's delivery slots between tenants (see the package comment). Safe for
// concurrent use; Take and Release allocate nothing for a tenant already known.
type Tracker struct {
	cfg       Config
	mu        sync.Mutex
	tenants   map[string]*share
	nextSweep time.Time
	// held is the slots all tenants hold.
	held int
}

// share is one tenant's state.
type share struct {
	held     int       // deliveries holding a slot
	weight   int       // the weight of its last Take
	deferred int       // deliveries turned away since it last took a slot
	waiting  time.Time // it counts as active until then (turned away lately)
	last     time.Time // its last Take or Release
}

// New returns a Tracker. It panics when cfg.Slots is not positive (a wiring bug).
func New(cfg Config) *Tracker {
	if cfg.Slots <= 0 {
		panic("slotshare.New: Slots must be positive")
	}
	if cfg.Reserve <= 0 {
		cfg.Reserve = max(1, cfg.Slots/50)
	}
	cfg.Reserve = min(cfg.Reserve, cfg.Slots-1)
	if cfg.MinDelay <= 0 {
		cfg.MinDelay = DefaultMinDelay
	}
	if cfg.MaxDelay < cfg.MinDelay {
		cfg.MaxDelay = max(DefaultMaxDelay, cfg.MinDelay)
	}
	if cfg.Waiting <= 0 {
		cfg.Waiting = DefaultWaiting
	}
	if cfg.Forget <= 0 {
		cfg.Forget = DefaultForget
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Float64 == nil {
		cfg.Float64 = func() float64 { return 0 }
	}
	return &Tracker{cfg: cfg, tenants: map[string]*share{}}
}

// Take asks for a slot for one delivery of tenant, of weight (values below 1 count as 1).
// single says the deployment has a single tenant (see the package comment). ok: the delivery
// holds a slot until its Release, which must follow on every path; else it holds none and is to
// come back after delay, and the tenant counts as waiting.
func (t *Tracker) Take(tenant string, weight int, single bool) (ok bool, delay time.Duration) {
	weight = max(weight, 1)
	now := t.cfg.Now()
	t.mu.Lock()
	defer t.mu.Unlock()
	t.sweepLocked(now)
	s := t.tenants[tenant]
	if s == nil {
		s = &share{}
		t.tenants[tenant] = s
	}
	s.weight, s.last = weight, now
	if t.held < t.cfg.Slots-t.cfg.Reserve || s.held < t.limitLocked(tenant, weight, single, now) {
		s.held++
		t.held++
		s.deferred = 0
		return true, 0
	}
	delay = t.cfg.MinDelay << min(s.deferred, 20)
	if delay <= 0 || delay > t.cfg.MaxDelay {
		delay = t.cfg.MaxDelay
	}
	delay += time.Duration(t.cfg.Float64() * float64(delay) / 2)
	s.deferred++
	s.waiting = now.Add(t.cfg.Waiting)
	return false, delay
}

// Release gives back the slot a Take of tenant granted. A Release with none held does nothing.
func (t *Tracker) Release(tenant string) {
	now := t.cfg.Now()
	t.mu.Lock()
	defer t.mu.Unlock()
	if s := t.tenants[tenant]; s != nil && s.held > 0 {
		s.held--
		t.held--
		s.last = now
	}
}

// Held returns how many slots tenant holds.
func (t *Tracker) Held(tenant string) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	if s := t.tenants[tenant]; s != nil {
		return s.held
	}
	return 0
}

// Limit returns how many slots tenant of weight may hold now while slots are scarce (see Take).
func (t *Tracker) Limit(tenant string, weight int, single bool) int {
	now := t.cfg.Now()
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.limitLocked(tenant, max(weight, 1), single, now)
}

// limitLocked is Limit with t.mu held.
func (t *Tracker) limitLocked(tenant string, weight int, single bool, now time.Time) int {
	sum, others := weight, false
	for name, s := range t.tenants {
		if name != tenant && s.active(now) {
			sum += s.weight
			others = true
		}
	}
	most := t.cfg.Slots - t.cfg.Reserve
	if !others {
		if single {
			return t.cfg.Slots
		}
		return most
	}
	return min(max((t.cfg.Slots*weight+sum/2)/sum, 1), most)
}

// active reports whether the tenant holds a slot or was turned away lately.
func (s *share) active(now time.Time) bool { return s.held > 0 || now.Before(s.waiting) }

// sweepLocked drops, once per Forget, the tenants idle for Forget: neither holding a slot nor
// waiting.
func (t *Tracker) sweepLocked(now time.Time) {
	if now.Before(t.nextSweep) {
		return
	}
	t.nextSweep = now.Add(t.cfg.Forget)
	for name, s := range t.tenants {
		if !s.active(now) && now.Sub(s.last) >= t.cfg.Forget {
			delete(t.tenants, name)
		}
	}
}

// Tenants returns how many tenants the tracker keeps (holding, waiting, or not yet forgotten).
func (t *Tracker) Tenants() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.tenants)
}
