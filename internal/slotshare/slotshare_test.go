package slotshare_test

import (
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/clocktest"
	"github.com/llmq/llmq/internal/slotshare"
)

type testBundle struct {
	clock *clocktest.Clock
	tr    *slotshare.Tracker
}

// setup returns a tracker of slots on a hand-set clock, with no jitter.
func setup(t *testing.T, slots int) *testBundle {
	t.Helper()
	clock := clocktest.New(time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC))
	return &testBundle{clock: clock, tr: slotshare.New(slotshare.Config{Slots: slots, Now: clock.Now})}
}

// take takes n slots for tenant, each granted.
func (b *testBundle) take(t *testing.T, tenant string, weight, n int) {
	t.Helper()
	for i := range n {
		ok, _ := b.tr.Take(tenant, weight, false)
		require.True(t, ok, "take %d of %s", i+1, tenant)
	}
}

// Alone, a tenant leaves the reserve free (max(1, Slots/50)) so that another tenant's task is
// delivered at all; in a deployment of a single tenant it takes every slot.
func TestTracker_Alone(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		slots  int
		single bool
		want   int
	}{
		{"SeveralTenantsSmall", 10, false, 9},
		{"SeveralTenantsDefault", 200, false, 196},
		{"SingleTenant", 10, true, 10},
		{"SingleTenantDefault", 200, true, 200},
		{"OneSlot", 1, false, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, tc.slots)
			got := 0
			for {
				ok, delay := b.tr.Take("flood", 1, tc.single)
				if !ok {
					require.Positive(t, delay)
					break
				}
				got++
				require.LessOrEqual(t, got, tc.slots)
			}
			require.Equal(t, tc.want, got)
			require.Equal(t, tc.want, b.tr.Held("flood"))
		})
	}
}

// With another tenant active, each may hold about Slots × w / Σw: a tenant over it (it took its
// slots alone) takes no more until its deliveries end below it, while the other takes its own.
func TestTracker_WeightedShares(t *testing.T) {
	t.Parallel()
	b := setup(t, 10)
	b.take(t, "flood", 1, 9)
	// beta (weight 2) is active from its first slot: flood's share is now 10 × 1/3.
	b.take(t, "beta", 2, 1)
	require.Equal(t, 3, b.tr.Limit("flood", 1, false))
	require.Equal(t, 7, b.tr.Limit("beta", 2, false))
	ok, _ := b.tr.Take("flood", 1, false)
	require.False(t, ok, "flood holds 9, over its share")
	b.take(t, "beta", 2, 6)
	ok, _ = b.tr.Take("beta", 2, false)
	require.False(t, ok, "beta holds its 7")
	for range 6 {
		b.tr.Release("flood")
	}
	ok, _ = b.tr.Take("flood", 1, false)
	require.False(t, ok, "flood holds its 3")
	b.tr.Release("flood")
	b.take(t, "flood", 1, 1)

	// A third tenant: weights 1, 2, 1 of 10 slots.
	b.take(t, "gamma", 1, 1)
	require.Equal(t, 3, b.tr.Limit("flood", 1, false))
	require.Equal(t, 5, b.tr.Limit("beta", 2, false))
	// In a single-tenant deployment (as the weights' cache last saw it) two active tenants
	// share all the same; a share never goes below one slot.
	require.Equal(t, 3, b.tr.Limit("flood", 1, true))
	require.Equal(t, 1, setupShared(t).tr.Limit("tiny", 1, false))
}

// setupShared is a tracker of 4 slots where "big" (weight 100) holds one.
func setupShared(t *testing.T) *testBundle {
	t.Helper()
	b := setup(t, 4)
	b.take(t, "big", 100, 1)
	return b
}

// A tenant turned away counts as active (it has work waiting) for Waiting after, so that the
// one holding every slot but the reserve gives back its share's worth as its calls end; then it
// is alone again.
func TestTracker_WaitingTenantCounts(t *testing.T) {
	t.Parallel()
	b := setup(t, 4)
	b.take(t, "flood", 1, 3)
	ok, _ := b.tr.Take("flood", 1, false)
	require.False(t, ok, "the reserve")
	b.take(t, "beta", 1, 2)
	ok, _ = b.tr.Take("beta", 1, false)
	require.False(t, ok, "beta's share is 2 of 4")
	b.tr.Release("beta")
	b.tr.Release("beta")
	b.tr.Release("flood")
	b.tr.Release("flood")
	// beta holds none but waits: flood is held to its share of 2 once slots are scarce (only the
	// reserve free); while more are free, it takes them.
	require.Equal(t, 2, b.tr.Limit("flood", 1, false))
	b.take(t, "flood", 1, 2)
	ok, _ = b.tr.Take("flood", 1, false)
	require.False(t, ok, "flood holds 3, over its share of 2, and the one slot free is the reserve")
	b.take(t, "beta", 1, 1) // under its share: the reserve is beta's
	b.tr.Release("beta")
	b.clock.Advance(slotshare.DefaultWaiting)
	require.Equal(t, 3, b.tr.Limit("flood", 1, false), "beta no longer waits")
	ok, _ = b.tr.Take("flood", 1, false)
	require.False(t, ok, "alone, flood leaves the reserve")
}

// Shares bind only when slots are scarce: a tenant holding a few slots and asking for no more
// does not keep the rest idle. With more than the reserve free, anyone takes a slot; at the
// reserve, only a tenant under its share.
func TestTracker_FreeSlotsAreTaken(t *testing.T) {
	t.Parallel()
	b := setup(t, 10)
	b.take(t, "beta", 2, 2)
	require.Equal(t, 3, b.tr.Limit("flood", 1, false), "flood's share beside beta")
	b.take(t, "flood", 1, 7) // up to the reserve of one, past its share of 3
	ok, _ := b.tr.Take("flood", 1, false)
	require.False(t, ok, "the last slot is the reserve, and flood is over its share")
	b.take(t, "beta", 2, 1) // beta, under its share of 7, takes the reserve
}

// Every Release gives one slot back: the executor releases on every way a delivery ends. A
// Release of nothing held changes nothing.
func TestTracker_Release(t *testing.T) {
	t.Parallel()
	b := setup(t, 3)
	b.take(t, "a", 1, 2)
	b.tr.Release("a")
	b.tr.Release("a")
	b.tr.Release("a")
	b.tr.Release("nobody")
	require.Zero(t, b.tr.Held("a"))
	b.take(t, "a", 1, 2)
}

// The delay of a tenant turned away doubles from MinDelay to MaxDelay while its deliveries keep
// being turned away, spread by up to half by the random source; a slot taken starts it again.
func TestTracker_Backoff(t *testing.T) {
	t.Parallel()
	clock := clocktest.New(time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC))
	rnd := 0.0
	tr := slotshare.New(slotshare.Config{Slots: 2, Now: clock.Now, Float64: func() float64 { return rnd }})
	ok, _ := tr.Take("a", 1, false)
	require.True(t, ok)
	var got []time.Duration
	for range 7 {
		ok, delay := tr.Take("a", 1, false)
		require.False(t, ok)
		got = append(got, delay)
	}
	ms := time.Millisecond
	require.Equal(t, []time.Duration{100 * ms, 200 * ms, 400 * ms, 800 * ms, 1600 * ms, 2000 * ms, 2000 * ms}, got)
	rnd = 0.5
	_, delay := tr.Take("a", 1, false)
	require.Equal(t, 2500*ms, delay, "jittered by a quarter of it")
	tr.Release("a")
	ok, _ = tr.Take("a", 1, false)
	require.True(t, ok)
	rnd = 0
	_, delay = tr.Take("a", 1, false)
	require.Equal(t, 100*ms, delay, "from the start again")
}

// A tenant neither holding nor waiting for Forget is dropped (once per Forget, at a Take); one
// holding a slot, however old, is kept.
func TestTracker_Forgets(t *testing.T) {
	t.Parallel()
	b := setup(t, 10)
	b.take(t, "old", 1, 1)
	b.tr.Release("old")
	b.take(t, "holder", 1, 1)
	require.Equal(t, 2, b.tr.Tenants())
	b.clock.Advance(slotshare.DefaultForget)
	b.take(t, "new", 1, 1)
	require.Equal(t, 2, b.tr.Tenants(), "old forgotten; holder and new kept")
	require.Equal(t, 1, b.tr.Held("holder"))
}

// Take and Release of a tenant already known allocate nothing (they run on every delivery).
func TestTracker_Allocs(t *testing.T) {
	b := setup(t, 10)
	b.take(t, "a", 1, 1)
	b.tr.Release("a")
	allocs := testing.AllocsPerRun(100, func() {
		ok, _ := b.tr.Take("a", 1, false)
		if ok {
			b.tr.Release("a")
		}
	})
	require.Zero(t, allocs)
}

// Takes and Releases from many deliveries at once (asynq's goroutines, at most Slots of them),
// of tenants whose weights change meanwhile, on a clock that moves past Waiting and Forget,
// leave every count where it started: no tenant holds a slot after, and a tenant alone takes
// all but the reserve again (the total held came back to zero, neither lost nor negative).
func TestTracker_Concurrent(t *testing.T) {
	t.Parallel()
	const slots = 8
	clock := clocktest.New(time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC))
	tr := slotshare.New(slotshare.Config{Slots: slots, Now: clock.Now, Forget: 3 * time.Second})
	tenants := []string{"a", "b", "c"}
	sem := make(chan struct{}, slots) // asynq's slots
	var wg sync.WaitGroup
	for g := range 4 * slots {
		wg.Go(func() {
			for i := range 500 {
				sem <- struct{}{}
				tenant := tenants[(g+i)%len(tenants)]
				if ok, delay := tr.Take(tenant, 1+i%3, false); ok {
					if g == 0 && i%50 == 0 {
						clock.Advance(time.Second) // Waiting, then Forget, pass now and then
					}
					tr.Release(tenant)
				} else if delay <= 0 {
					panic("turned away without a delay")
				}
				<-sem
			}
		})
	}
	wg.Wait()
	for _, tenant := range tenants {
		require.Zero(t, tr.Held(tenant), tenant)
	}
	clock.Advance(slotshare.DefaultWaiting)
	for i := range slots - 1 {
		ok, _ := tr.Take("alone", 1, false)
		require.True(t, ok, "take %d", i+1)
	}
	ok, _ := tr.Take("alone", 1, false)
	require.False(t, ok, "the reserve")
}
