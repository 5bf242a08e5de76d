package pgwait_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/llmq/llmq/internal/pgtest"
	"github.com/llmq/llmq/internal/pgwait"
)

// BenchmarkAcquire is the cost of a bound on a pool's Acquire and Release of an idle connection
// (what a request adds per statement): run with -benchmem, bounded against unbounded.
func BenchmarkAcquire(b *testing.B) {
	pcfg, err := pgxpool.ParseConfig(pgtest.URL(b) + "&pool_max_conns=1")
	if err != nil {
		b.Fatal(err)
	}
	pcfg.ConnConfig.Tracer = pgwait.Tracer{}
	pool, err := pgxpool.NewWithConfig(context.Background(), pcfg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(pool.Close)
	for _, bounded := range []bool{false, true} {
		name := "unbounded"
		if bounded {
			name = "bounded"
		}
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				ctx, cancel := context.Background(), func() {}
				if bounded {
					ctx, cancel = pgwait.Bound(ctx, 5*time.Second)
				}
				c, err := pool.Acquire(ctx)
				if err != nil {
					b.Fatal(err)
				}
				c.Release()
				cancel()
			}
		})
	}
}
