package e2e_test

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestRetryBudget_CountsEachFirstAttemptOnce: the worker counts every job's first attempt, once,
// as the base of its credential's retry budget (10 + 10% of first attempts per window), so the
// budget then grants exactly 10 + n/10 retries.
func TestRetryBudget_CountsEachFirstAttemptOnce(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	const n = 30
	ids := make([]string, n)
	for i := range ids {
		ids[i] = b.submit(t, anthropicBody(fmt.Sprintf("job %d", i)))
	}
	for _, id := range ids {
		require.Equal(t, "succeeded", b.waitTerminal(t, id)["status"])
	}
	lc := b.limiterCredential(t, "default")
	allowed := 0
	for {
		ok, err := lc.AllowRetry(t.Context(), "")
		require.NoError(t, err)
		if !ok {
			break
		}
		allowed++
	}
	require.Equal(t, 10+n/10, allowed)
}
