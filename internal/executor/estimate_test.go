package executor_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/tokens"
)

// An answer whose usage reports the output but no input (a gateway's or a cut-short stream's
// partial usage: every prompt is at least one token) keeps the input reserved charged, as an
// answer without usage does: reconciled to 0 input, the grant was refunded its whole prompt
// and the next requests overdrew the provider's input-token limit.
func TestExecutor_UsageWithoutInputKeepsTheInputCharged(t *testing.T) {
	t.Parallel()
	for _, stream := range []bool{false, true} {
		t.Run(fmt.Sprintf("stream=%v", stream), func(t *testing.T) {
			t.Parallel()
			gate, limit, est := runCached(t, `{"output_tokens":3}`, stream)
			// Of the minute's 1,000 input tokens ~625 are still in use: another 625 wait.
			r, err := gate.ReserveCost(t.Context(), limit, tokens.Cost{InputTokens: 625})
			require.NoError(t, err)
			require.Greater(t, r.Wait, time.Second, "the input was refunded on a usage that did not report it")
			require.Equal(t, 1.25, est.Ratio("cache", "default", "claude-test"), "nothing to learn from")
		})
	}
}

// The executor estimates a job's request, and learns from its answer, for the job's tenant (see
// estimator.TestEstimator_PerTenant): the ratio an answer teaches is the tenant's.
func TestExecutor_EstimateLearnedForTheJobsTenant(t *testing.T) {
	t.Parallel()
	// ~502 tokens by the rule; the provider counts 401: a ratio of ~0.8, below InitialRatio, so
	// that the credential's ratio does not stand in for the tenant's.
	_, _, est := runCached(t, `{"input_tokens":401,"output_tokens":3}`, false)
	require.InDelta(t, 0.8, est.Ratio("cache", "default", "claude-test"), 0.01,
		"the answer did not teach the job's tenant")
	require.Equal(t, 1.25, est.Ratio("cache", "other", "claude-test"), "another tenant learned it")
}
