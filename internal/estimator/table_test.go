package estimator

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
)

// The table's lists by count stay those of its tenants, whatever the inserts, reads and
// evictions, and a tenant below its share takes its place from a tenant holding the most.
func TestTable_ListsByCountFollowTheTenants(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(1, 2))
	tb := newTable(50)
	for i := range 5000 {
		tenant := fmt.Sprint("t", rng.IntN(12))
		if rng.IntN(4) == 0 {
			tenant = "flood"
		}
		k := key{credential: "c", tenant: tenant, model: fmt.Sprint("m", rng.IntN(40))}
		if _, ok := tb.get(k); !ok && len(tb.entries) >= tb.max {
			o := tb.byTenant[tenant]
			tenants := len(tb.byTenant)
			if o == nil {
				tenants++
			}
			if o == nil || o.entries.Len()*tenants < tb.max {
				most := 0
				for _, o := range tb.byTenant {
					most = max(most, o.entries.Len())
				}
				before := counts(tb)
				tb.set(k, tenant, state{ratio: 1})
				after := counts(tb)
				lost := ""
				for name, n := range before {
					if after[name] < n {
						lost = name
					}
				}
				require.Equal(t, most, before[lost], "op %d: a tenant below its share took a place from one not holding the most", i)
				checkTable(t, tb)
				continue
			}
		}
		tb.set(k, tenant, state{ratio: 1})
		checkTable(t, tb)
	}
}

func counts(tb *table) map[string]int {
	m := make(map[string]int)
	for name, o := range tb.byTenant {
		m[name] = o.entries.Len()
	}
	return m
}

// checkTable checks that byCount lists each tenant once, under what it holds, and that most is
// the largest count.
func checkTable(t *testing.T, tb *table) {
	t.Helper()
	require.LessOrEqual(t, len(tb.entries), tb.max)
	seen, total, most := 0, 0, 0
	for n := 1; n < len(tb.byCount); n++ {
		var prev *owner
		for o := tb.byCount[n]; o != nil; o = o.next {
			require.Equal(t, n, o.entries.Len(), o.name)
			require.Same(t, prev, o.prev, o.name)
			require.Same(t, o, tb.byTenant[o.name], o.name)
			prev = o
			seen++
			total += n
			most = n
		}
	}
	require.Equal(t, len(tb.byTenant), seen)
	require.Equal(t, len(tb.entries), total)
	require.Equal(t, most, tb.most)
}
