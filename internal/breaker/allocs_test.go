package breaker_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/breaker"
	"github.com/llmq/llmq/internal/redistest"
)

// TestCircuit_AllowAllocs pins the allocations of Allow, which every job makes: it boxed the
// script's SHA and the circuit's two keys into interfaces at every call, in go-redis's
// Script.Run: 26 allocations; with the SHA boxed once per script and the keys once per circuit
// (redisscript.Script), 20. The bound is the count with the time and the call id formatted into
// one buffer (redisscript.Args) and the configuration's numbers boxed once, by New, instead of a
// string or a boxed integer each at every call.
func TestCircuit_AllowAllocs(t *testing.T) { // not parallel: testing.AllocsPerRun
	if raceEnabled {
		t.Skip("the race detector's sync.Pool drops go-redis's pooled buffers at random")
	}
	b := setup(t, nil)
	c := b.creds[0]
	ctx := context.Background()
	_, err := c.Allow(ctx) // the connection, and the script cached
	require.NoError(t, err)
	allocs := testing.AllocsPerRun(200, func() {
		b.clock.Advance(time.Millisecond)
		if _, err := c.Allow(ctx); err != nil {
			panic(err)
		}
	})
	t.Logf("Allow: %.1f allocations", allocs)
	require.LessOrEqual(t, allocs, 12.0)
}

// BenchmarkCircuit_Allow measures Allow, a script call every job makes, on the local
// Redis.
func BenchmarkCircuit_Allow(b *testing.B) {
	br, err := breaker.New(redistest.Client(b), &breaker.Config{Prefix: redistest.Prefix(b)})
	require.NoError(b, err)
	c := br.Circuit(testID, testName)
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := c.Allow(ctx); err != nil {
			b.Fatal(err)
		}
	}
}
