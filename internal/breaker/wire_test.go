package breaker_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/breaker"
	"github.com/llmq/llmq/internal/clocktest"
	"github.com/llmq/llmq/internal/redistest"
)

// TestCircuit_WireArgs pins the exact arguments the per-job script calls (Allow, Report) send: the
// processes of the last release share the scripts' keys and SHAs, so however the arguments are
// built they must reach Redis byte for byte as before. Call ids (random per process) and the key
// prefix are replaced.
func TestCircuit_WireArgs(t *testing.T) {
	t.Parallel()
	w := redistest.NewWire(t)
	prefix := redistest.Prefix(t)
	clock := clocktest.New(t0)
	br, err := breaker.New(w.Client, &breaker.Config{Prefix: prefix, Now: clock.Now, SuccessMemory: time.Minute,
		CooldownFactor: 1.5})
	require.NoError(t, err)
	c := br.Circuit(testID, testName)
	ctx := context.Background()
	got := w.CachedEvalSHAs(t, strings.NewReplacer(prefix, "P:", strings.TrimPrefix(c.Key(), prefix), "K"), func() {
		for _, o := range []breaker.Outcome{breaker.Success, breaker.Failure, breaker.Neutral} {
			a, err := c.Allow(ctx)
			require.NoError(t, err)
			_, err = c.Report(ctx, a, o)
			require.NoError(t, err)
		}
	})
	require.Equal(t, []string{
		"evalsha | 394ab734a415538ae5de1efbe6ee628a3e959c6a | 2 | P:K | P:K:lease | 1893499200000000 | 120000000 | 1000000 | 86520000 | 5 | 60000000 | 600000 | ID",
		"evalsha | ec780274abed1c042f634e10469f05b2f85a5027 | 2 | P:K | P:K:lease | 1893499200000000 | 0 | success | 5 | 2000000 | 600000 | 86400000 | 0 | 60000000 | 3750000 | 1.5 | 30000000 | 600000 | ",
		"evalsha | 394ab734a415538ae5de1efbe6ee628a3e959c6a | 2 | P:K | P:K:lease | 1893499200000000 | 120000000 | 1000000 | 86520000 | 5 | 60000000 | 600000 | ID",
		"evalsha | ec780274abed1c042f634e10469f05b2f85a5027 | 2 | P:K | P:K:lease | 1893499200000000 | 0 | failure | 5 | 2000000 | 600000 | 86400000 | 0 | 60000000 | 3750000 | 1.5 | 30000000 | 600000 | ID",
		"evalsha | 394ab734a415538ae5de1efbe6ee628a3e959c6a | 2 | P:K | P:K:lease | 1893499200000000 | 120000000 | 1000000 | 86520000 | 5 | 60000000 | 600000 | ID",
		"evalsha | ec780274abed1c042f634e10469f05b2f85a5027 | 2 | P:K | P:K:lease | 1893499200000000 | 0 | neutral | 5 | 2000000 | 600000 | 86400000 | 0 | 60000000 | 3750000 | 1.5 | 30000000 | 600000 | ",
	}, got)
}
