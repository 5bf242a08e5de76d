package limiter_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/clocktest"
	"github.com/llmq/llmq/internal/limiter"
	"github.com/llmq/llmq/internal/redistest"
	"github.com/llmq/llmq/internal/tokens"
)

// TestGate_WireArgs pins the exact arguments the per-job script calls send: the processes of the
// last release share the scripts' keys and SHAs, so however the arguments are built (boxed one by
// one, or formatted into one buffer) they must reach Redis byte for byte as before. Call ids are
// random per process and the key prefix per test; both are replaced.
func TestGate_WireArgs(t *testing.T) {
	t.Parallel()
	w := redistest.NewWire(t)
	prefix := redistest.Prefix(t)
	clock := clocktest.New(t0)
	l, err := limiter.New(w.Client, &limiter.Config{Prefix: prefix, Now: clock.Now})
	require.NoError(t, err)
	g := l.Gate("sk-wire", "wire")
	ctx := context.Background()
	lim := limiter.Limit{Rate: 2.5, Burst: 300, InputTokensPerMinute: 1e6, OutputTokensPerMinute: 1.5e5,
		TokensPerMinute: 2e6}
	cost := tokens.Cost{InputTokens: 1200, OutputTokens: 350}
	lane := &limiter.Lane{Tenant: "acme", Weight: 3, Priority: limiter.PriorityLow, Ticket: "job-7",
		Since: t0.Add(-1500 * time.Microsecond)}
	got := w.CachedEvalSHAs(t, strings.NewReplacer(prefix, "P:", g.Tag(), "tag"), func() {
		_, err := g.Reserve(ctx, lim)
		require.NoError(t, err)
		_, err = g.ReserveAttempt(ctx, lim, tokens.Cost{}, limiter.AttemptOptions{UnlessPaused: true, FirstAttempt: true})
		require.NoError(t, err)
		_, err = g.ReserveAttempt(ctx, lim, cost, limiter.AttemptOptions{UnlessPaused: true, PauseDurable: true,
			Lane: lane, ReportSend: true, Circuit: &limiter.CircuitCheck{Key: prefix + "circuit", SuccessMemory: time.Minute}})
		require.NoError(t, err)
		_, err = g.ReserveAttempt(ctx, lim, cost, limiter.AttemptOptions{ReportSend: true})
		require.NoError(t, err)
		require.NoError(t, g.Observe(ctx, limiter.Observation{At: t0, StatusCode: 200, HeadersKnown: true, Limit: 500,
			Remaining: 499, Seq: 9}))
		require.NoError(t, g.Observe(ctx, limiter.Observation{At: t0, StatusCode: 429, HasRetryAfter: true,
			RetryAfter: 2 * time.Second}))
		require.NoError(t, g.Observe(ctx, limiter.Observation{At: t0, SentAt: t0.Add(-300 * time.Millisecond),
			StatusCode: 200, Grant: 1,
			InputTokens: limiter.TokenObservation{Known: true, Limit: 400000, Remaining: 398800,
				RemainingGranularity: 1000, ResetAt: t0.Add(1500 * time.Millisecond)},
			Tokens: limiter.TokenObservation{Known: true, Limit: 2000000, Remaining: 1999000}}))
		require.NoError(t, g.Reconcile(ctx, 1, tokens.Cost{InputTokens: 1100, OutputTokens: 20}))
		_, err = g.Sent(ctx, 7)
		require.NoError(t, err)
	})
	require.Equal(t, []string{
		"evalsha | 036e138f54cf052cad5562017aaa232ddda56ad8 | 1 | P:tag:rl | 1893499200000000 ID | 2.5 | 300 | 100000 | 0.01 | 600000000 | 30000000 | 10000 | 250000",
		"evalsha | 036e138f54cf052cad5562017aaa232ddda56ad8 | 5 | P:tag:rl | P:tag:tk | P:tag:tkg | P:tag:pause | P:tag:budget | 1893499200000000 ID | 2.5 | 300 | 100000 | 0.01 | 600000000 | 30000000 | 10000 | 250000 |  |  |  |  |  |  |  |  |  |  |  |  | 1 | 1 | 60000000 | 12 | 0.1 | 10",
		"evalsha | 036e138f54cf052cad5562017aaa232ddda56ad8 | 10 | P:tag:rl | P:tag:tk | P:tag:tkg | P:tag:pause | P:tag:budget | P:tag:fq | P:tag:fql | P:tag:fqd | P:tag:fq:acme|2 | P:circuit | 1893499200000000 ID | 2.5 | 300 | 100000 | 0.01 | 600000000 | 30000000 | 10000 | 250000 | 1 | 1e+06 | 150000 | 2e+06 | 1200 | 350 | 1550 | 60000000 | 1000000 | 4096 | 1200 | 1550 | 2 |  | 60000000 | 12 | 0.1 | 10 | 1 | P:tag:fq: | acme|2 | acme | 2 | 3 | job-7 | 1893499199998500 | 0.1 | 0.05 | 50000 | 5000000 | 30000000 | 1 | 1 | 60000000",
		"evalsha | 036e138f54cf052cad5562017aaa232ddda56ad8 | 5 | P:tag:rl | P:tag:tk | P:tag:tkg | P:tag:pause | P:tag:budget | 1893499200000000 ID | 2.5 | 300 | 100000 | 0.01 | 600000000 | 30000000 | 10000 | 250000 | 1 | 1e+06 | 150000 | 2e+06 | 1200 | 350 | 1550 | 60000000 | 1000000 | 4096 | 1200 | 1550 |  |  | 60000000 | 12 | 0.1 | 10 |  |  |  |  |  |  |  |  |  |  |  |  |  | 1",
		"evalsha | 34008270610a60038d2308412a044541e7c87923 | 1 | P:tag:rl | 1893499200000000 ID | 200 | 1 | 500 | 499 | 0 | 0 |  | 600000000 | 0.1 | 9 | 600000000 |  |  | 0",
		"evalsha | 34008270610a60038d2308412a044541e7c87923 | 1 | P:tag:rl | 1893499200000000 ID | 429 | 0 | 0 | 0 | 0 | 0 | 2000000 | 600000000 | 0.1 | 0 | 600000000 | 2000000 | 2000000 | 0",
		"evalsha | 34008270610a60038d2308412a044541e7c87923 | 1 | P:tag:rl | 1893499200000000 ID | 200 | 0 | 0 | 0 | 0 | 0 |  | 600000000 | 0.1 | 0 | 600000000 |  |  | -300000",
		"evalsha | c280fb5d34e8193a3357cce4540e634a95657cea | 2 | P:tag:tk | P:tag:tkg | 1893499200000000 | 600000000 | 0.01 | 60000000 | 1 | 400000 | 398800 | 1000 | 1800000 | 1500000 | -300000 | 0 | 0 | 0 | 0 | 0 | 0 | 0 | 1 | 2000000 | 1999000 | 1 | 0 | 0 | -300000 | 1 | 4096",
		"evalsha | 450d464a98fb48c15ff1571f678f19a05b4a6c09 | 2 | P:tag:tk | P:tag:tkg | 1893499200000000 | 1 | 1100 | 20 | 600000000",
		"evalsha | 163ce6deb8fef09e44d6de210acd67666ce1dc42 | 2 | P:tag:rl | P:tag:tk | 1893499200000000 ID | 7",
	}, got)
}
