package pgwait_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/pgwait"
)

// TestCollector_ShowsASaturatedPool: an operator whose API answers 503 overloaded (no pool
// connection within the bound) sees why on /metrics: every connection of the pool taken, the
// acquires that had to wait and how long, and those whose wait ended unserved (the bound, a
// client gone). Without it the saturation left no trace: the 503 is not logged, and
// llmq_http_responses_total counts it with Postgres being down.
func TestCollector_ShowsASaturatedPool(t *testing.T) {
	t.Parallel()
	pool := newPool(t)
	reg := prometheus.NewRegistry()
	reg.MustRegister(pgwait.NewCollector(pool))

	base, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	held, err := pool.Acquire(base)
	require.NoError(t, err)
	ctx, done := pgwait.Bound(base, 20*time.Millisecond)
	_, err = pool.Exec(ctx, `SELECT 1`)
	done()
	require.ErrorIs(t, err, context.Canceled)

	require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP llmq_postgres_pool_acquired_connections Connections of the process's Postgres pool in use now.
# TYPE llmq_postgres_pool_acquired_connections gauge
llmq_postgres_pool_acquired_connections 1
# HELP llmq_postgres_pool_max_connections The most connections the process's Postgres pool opens (pool_max_conns).
# TYPE llmq_postgres_pool_max_connections gauge
llmq_postgres_pool_max_connections 1
# HELP llmq_postgres_pool_canceled_acquires_total Waits for a connection of the Postgres pool that ended unserved: the API's wait bound (503 overloaded), or a caller gone.
# TYPE llmq_postgres_pool_canceled_acquires_total counter
llmq_postgres_pool_canceled_acquires_total 1
`), "llmq_postgres_pool_acquired_connections", "llmq_postgres_pool_max_connections", "llmq_postgres_pool_canceled_acquires_total"))
	waited, err := gathered(reg, "llmq_postgres_pool_waited_acquires_total")
	require.NoError(t, err)
	require.GreaterOrEqual(t, waited, 1.0, "an acquire found no idle connection")
	seconds, err := gathered(reg, "llmq_postgres_pool_acquire_wait_seconds_total")
	require.NoError(t, err)
	require.Greater(t, seconds, 0.0)

	held.Release()
	require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP llmq_postgres_pool_acquired_connections Connections of the process's Postgres pool in use now.
# TYPE llmq_postgres_pool_acquired_connections gauge
llmq_postgres_pool_acquired_connections 0
`), "llmq_postgres_pool_acquired_connections"))
}

// gathered is the value of the single series name in reg.
func gathered(reg *prometheus.Registry, name string) (float64, error) {
	families, err := reg.Gather()
	if err != nil {
		return 0, err
	}
	for _, f := range families {
		if f.GetName() == name && len(f.GetMetric()) == 1 {
			m := f.GetMetric()[0]
			if c := m.GetCounter(); c != nil {
				return c.GetValue(), nil
			}
			return m.GetGauge().GetValue(), nil
		}
	}
	return 0, nil
}
