package breaker_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/breaker"
	"github.com/llmq/llmq/internal/clocktest"
	"github.com/llmq/llmq/internal/redistest"
)

// A Failure report whose reply is lost after Redis ran it (the connection cut: a failover, a
// proxy restart, CLIENT KILL) is sent again by go-redis on a new connection: the retry must not
// count the failure twice, or fewer failures than Threshold open the breaker.
func TestReport_LostReplyCountsOnce(t *testing.T) {
	t.Parallel()
	prefix := redistest.Prefix(t)
	clock := clocktest.New(t0)
	rdb, cut := redistest.CutClient(t)
	br, err := breaker.New(rdb, &breaker.Config{Prefix: prefix, Now: clock.Now, Threshold: 3})
	require.NoError(t, err)
	c := br.Circuit(testID, testName)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	fail := func() breaker.State {
		a, err := c.Allow(ctx)
		require.NoError(t, err)
		require.True(t, a.Allowed)
		st, err := c.Report(ctx, a, breaker.Failure)
		require.NoError(t, err)
		return st
	}

	require.Equal(t, breaker.Closed, fail(), "Redis caches the report's script (a NOSCRIPT runs nothing)")
	cut.Arm("failure")
	require.Equal(t, breaker.Closed, fail(), "the second failure, its reply lost")
	require.Equal(t, 1, cut.Cuts())
	st, err := c.Status(ctx)
	require.NoError(t, err)
	require.Equal(t, breaker.Closed, st.State, "two failures of three: still closed")
	require.Equal(t, breaker.Open, fail(), "the third failure opens it")
}
