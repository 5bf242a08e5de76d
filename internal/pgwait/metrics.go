package pgwait

import (
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
)

// Collector exports a pool's saturation: its size, the connections in use, and the acquires
// that waited, for how long, and those whose wait ended unserved (a Bound that fired: the API's
// 503 overloaded; or a caller gone). It reads the pool's own counters at each scrape.
type Collector struct {
	pool                                               *pgxpool.Pool
	max, acquired, acquires, waited, waitSec, unserved *prometheus.Desc
}

// NewCollector returns the Collector of pool; register it once per pool.
func NewCollector(pool *pgxpool.Pool) *Collector {
	return &Collector{
		pool:     pool,
		max:      prometheus.NewDesc("llmq_postgres_pool_max_connections", "The most connections the process's Postgres pool opens (pool_max_conns).", nil, nil),
		acquired: prometheus.NewDesc("llmq_postgres_pool_acquired_connections", "Connections of the process's Postgres pool in use now.", nil, nil),
		acquires: prometheus.NewDesc("llmq_postgres_pool_acquires_total", "Connections taken from the Postgres pool.", nil, nil),
		waited: prometheus.NewDesc("llmq_postgres_pool_waited_acquires_total",
			"Acquires of a Postgres pool connection that found none idle and waited (for one to come free, or to be opened).", nil, nil),
		waitSec: prometheus.NewDesc("llmq_postgres_pool_acquire_wait_seconds_total",
			"Time spent by the acquires that waited for a Postgres pool connection.", nil, nil),
		unserved: prometheus.NewDesc("llmq_postgres_pool_canceled_acquires_total",
			"Waits for a connection of the Postgres pool that ended unserved: the API's wait bound (503 overloaded), or a caller gone.", nil, nil),
	}
}

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.max, c.acquired, c.acquires, c.waited, c.waitSec, c.unserved} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	s := c.pool.Stat()
	ch <- prometheus.MustNewConstMetric(c.max, prometheus.GaugeValue, float64(s.MaxConns()))
	ch <- prometheus.MustNewConstMetric(c.acquired, prometheus.GaugeValue, float64(s.AcquiredConns()))
	ch <- prometheus.MustNewConstMetric(c.acquires, prometheus.CounterValue, float64(s.AcquireCount()))
	ch <- prometheus.MustNewConstMetric(c.waited, prometheus.CounterValue, float64(s.EmptyAcquireCount()))
	ch <- prometheus.MustNewConstMetric(c.waitSec, prometheus.CounterValue, s.EmptyAcquireWaitTime().Seconds())
	ch <- prometheus.MustNewConstMetric(c.unserved, prometheus.CounterValue, float64(s.CanceledAcquireCount()))
}
