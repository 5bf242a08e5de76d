package breaker_test

import (
	"fmt"
	"maps"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/breaker"
)

// model is the breaker's specification in plain Go: one process, no Redis, no TTLs. The model
// test drives it in lockstep with the real breaker.
type model struct {
	cfg breaker.Config // with every field set

	written     bool // any write has happened (a report with no key skips the generation check)
	state       breaker.State
	gen         int64
	fails       int
	ok          time.Time // last Success recorded; zero: none
	seq         int64
	leases      map[int64]time.Time // cold-start slots: id → deadline
	cd          time.Duration       // the current open period's cooldown; 0 while closed
	since       time.Time
	until       time.Time
	transitions map[breaker.State]int
	rejected    int
}

// modelAdmission is the model's side of an admission.
type modelAdmission struct{ gen, lease int64 }

func newModel(cfg breaker.Config) *model {
	return &model{cfg: cfg, state: breaker.Closed, leases: map[int64]time.Time{}, transitions: map[breaker.State]int{}}
}

func (m *model) cold(now time.Time) bool {
	return m.cfg.SuccessMemory > 0 && (m.ok.IsZero() || now.Sub(m.ok) >= m.cfg.SuccessMemory)
}

func (m *model) allow(now time.Time) (breaker.Admission, modelAdmission) {
	refuse := func(capped bool, at time.Time) (breaker.Admission, modelAdmission) {
		m.rejected++
		return breaker.Admission{State: m.state, Capped: capped, RetryAt: at, Wait: at.Sub(now)}, modelAdmission{}
	}
	probe := func() (breaker.Admission, modelAdmission) {
		m.gen++
		m.until = now.Add(m.cfg.ProbeTimeout)
		return breaker.Admission{Allowed: true, Probe: true, State: breaker.HalfOpen}, modelAdmission{gen: m.gen}
	}
	switch m.state {
	case breaker.Closed:
		if !m.cold(now) {
			return breaker.Admission{Allowed: true, State: breaker.Closed}, modelAdmission{gen: m.gen}
		}
		maps.DeleteFunc(m.leases, func(_ int64, d time.Time) bool { return !d.After(now) })
		if len(m.leases) < max(m.cfg.Threshold-m.fails, 1) {
			m.written = true
			m.seq++
			m.leases[m.seq] = now.Add(m.cfg.ProbeTimeout)
			return breaker.Admission{Allowed: true, State: breaker.Closed}, modelAdmission{gen: m.gen, lease: m.seq}
		}
		first := slices.MinFunc(slices.Collect(maps.Values(m.leases)), func(a, b time.Time) int { return a.Compare(b) })
		return refuse(true, minTime(first, now.Add(m.cfg.Recheck)))
	case breaker.Open:
		if now.Before(m.until) {
			return refuse(false, m.until)
		}
		m.state, m.since = breaker.HalfOpen, now
		m.transitions[breaker.HalfOpen]++
		return probe()
	default: // half-open
		if now.Before(m.until) {
			return refuse(false, minTime(m.until, now.Add(m.cfg.Recheck)))
		}
		return probe()
	}
}

func (m *model) report(now time.Time, a modelAdmission, o breaker.Outcome) breaker.State {
	if m.written && a.gen != m.gen {
		return m.state
	}
	open := func(cd time.Duration) breaker.State {
		m.written = true
		m.state, m.gen, m.since, m.until, m.fails, m.cd = breaker.Open, m.gen+1, now, now.Add(cd), 0, cd
		clear(m.leases)
		m.transitions[breaker.Open]++
		return breaker.Open
	}
	switch m.state {
	case breaker.Closed:
		delete(m.leases, a.lease)
		switch o {
		case breaker.Failure:
			m.written = true
			m.fails++
			if m.fails >= m.cfg.Threshold {
				return open(m.cfg.Cooldown)
			}
		case breaker.Success:
			if m.cold(now) {
				clear(m.leases)
			}
			stamp := m.cfg.SuccessMemory > 0 && (m.ok.IsZero() || now.Sub(m.ok) >= m.cfg.SuccessMemory/16)
			if m.fails > 0 || stamp {
				m.written, m.fails = true, 0
				if stamp {
					m.ok = now
				}
			}
		}
	case breaker.HalfOpen:
		switch o {
		case breaker.Failure:
			next := time.Duration(math.Floor(float64(m.cd.Microseconds())*m.cfg.CooldownFactor)) * time.Microsecond
			return open(min(next, m.cfg.MaxCooldown))
		case breaker.Success:
			m.state, m.gen, m.since, m.fails, m.until, m.cd = breaker.Closed, m.gen+1, now, 0, time.Time{}, 0
			if m.cfg.SuccessMemory > 0 {
				m.ok = now
			}
			m.transitions[breaker.Closed]++
		default:
			m.gen++
			m.until = time.Time{}
		}
	}
	return m.state
}

func (m *model) status(now time.Time) breaker.Status {
	s := breaker.Status{State: m.state, Since: m.since}
	if m.state != breaker.Closed {
		s.Until = m.until
		return s
	}
	s.Failures = m.fails
	if m.cold(now) {
		s.Capped = true
		for _, d := range m.leases {
			if d.After(now) {
				s.InFlight++
			}
		}
	}
	return s
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

// The real breaker matches the model step by step while many admissions are out at once,
// reported late and in any order, some never (a crashed caller), over a provider that goes down
// and comes back: every Admission, every reported state, every Status, the metrics.
func TestCredential_Model(t *testing.T) {
	t.Parallel()
	for _, seed := range []uint64{1, 2, 3, 4, 5, 6} {
		t.Run(fmt.Sprintf("Seed%d", seed), func(t *testing.T) {
			t.Parallel()
			b := setup(t, func(c *breaker.Config) {
				c.Threshold = 3
				c.Cooldown = 2 * time.Second
				c.MaxCooldown = 7 * time.Second // 2, 4, 7, 7: a cap that is not a power of two
				// Odd seeds: slots expire before the credential can go cold again; even seeds: after
				// (as with the defaults, 2m > 1m), so slots left when a Success lifted the cap matter.
				c.ProbeTimeout = 5 * time.Second
				if seed%2 == 0 {
					c.ProbeTimeout = 30 * time.Second
				}
				c.Recheck = 700 * time.Millisecond
				c.SuccessMemory = 20 * time.Second
			})
			cfg := b.cfg
			cfg.CooldownFactor = breaker.DefaultCooldownFactor
			m := newModel(cfg)
			ctx := t.Context()
			rng := rand.New(rand.NewPCG(seed, 0x30de1))

			type pair struct {
				real breaker.Admission
				m    modelAdmission
			}
			var out []pair
			down := false
			seen := map[string]int{}
			allow := func(where string) {
				now := b.clock.Now()
				a, err := b.creds[rng.IntN(2)].Allow(ctx)
				require.NoError(t, err)
				want, ma := m.allow(now)
				require.Equal(t, want, zeroGen(a), where)
				if a.Allowed {
					out = append(out, pair{a, ma})
					seen[fmt.Sprintf("allowed %s probe=%v", a.State, a.Probe)]++
				} else {
					seen[fmt.Sprintf("refused %s capped=%v", a.State, a.Capped)]++
				}
			}
			for step := range 3000 {
				if rng.IntN(150) == 0 {
					down = !down
				}
				idle := rng.IntN(100) == 0
				if idle {
					b.clock.Advance(m.cfg.SuccessMemory) // the credential goes cold
				}
				b.clock.Advance(time.Duration(rng.IntN(4)) * time.Duration(rng.IntN(500)) * time.Millisecond)
				now := b.clock.Now()
				where := fmt.Sprintf("step %d at %v", step, now.Sub(t0))
				switch r := rng.IntN(40); {
				case r == 0 || idle: // a burst of callers at one instant
					for range 8 {
						allow(where)
					}
				case r < 20 || len(out) == 0:
					allow(where)
				case r < 36:
					i := rng.IntN(len(out))
					p := out[i]
					out = slices.Delete(out, i, i+1)
					o := breaker.Neutral
					switch x := rng.Float64(); {
					case down && x < 0.9, !down && x < 0.1:
						o = breaker.Failure
					case x < 0.95:
						o = breaker.Success
					}
					st, err := b.creds[rng.IntN(2)].Report(ctx, p.real, o)
					require.NoError(t, err)
					require.Equal(t, m.report(now, p.m, o), st, where)
				default: // the caller crashed: never reported
					i := rng.IntN(len(out))
					out = slices.Delete(out, i, i+1)
				}
				require.Equal(t, m.status(now), b.status(t), where)
			}
			for _, to := range []breaker.State{breaker.Open, breaker.HalfOpen, breaker.Closed} {
				require.Equal(t, m.transitions[to], b.transitions(t, to), "transitions to %s", to)
			}
			require.Equal(t, float64(m.rejected), b.metric(t, "llmq_breaker_rejected_total", map[string]string{"credential": testName}))
			// The walk must have visited every kind of answer, or it proves little.
			for _, k := range []string{
				"allowed closed probe=false", "allowed half_open probe=true", "refused open capped=false",
				"refused half_open capped=false", "refused closed capped=true",
			} {
				require.Positive(t, seen[k], "never saw %q: %v", k, seen)
			}
			require.Positive(t, m.transitions[breaker.Open])
		})
	}
}
