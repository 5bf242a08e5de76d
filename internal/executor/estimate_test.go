package executor_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/estimator"
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

// An answer whose usage reports the input but no output (a gateway's partial usage: every answer
// is at least a token) keeps the output reserved charged, as it keeps the input of a usage
// without input: reconciled to 0 output, the grant was refunded its whole output allowance and
// the next requests overdrew the provider's output-token limit. (A stream cut after
// message_start, which reports no output count, keeps its allowance too:
// TestExecutor_FailedStreamSettlesProviderInput.)
func TestExecutor_UsageWithoutOutputKeepsTheOutputCharged(t *testing.T) {
	t.Parallel()
	gate, limit, _ := runCached(t, `{"input_tokens":500}`, false)
	// Of the minute's 30 output tokens 16 (max_tokens) are still in use: another 20 wait.
	r, err := gate.ReserveCost(t.Context(), limit, tokens.Cost{OutputTokens: 20})
	require.NoError(t, err)
	require.Greater(t, r.Wait, time.Second, "the output allowance was refunded on a usage that did not report it")
}

// A completed Anthropic stream whose output count was never reported after message_start (its
// message_delta without usage, or without output_tokens: a gateway's) keeps the output reserved
// charged, as a usage without output does. message_start's output_tokens is a placeholder (1)
// written before any output: settled with it, the grant was refunded all but one token of its
// output allowance, though the answer may have been max_tokens long.
func TestExecutor_StreamWithoutOutputReportKeepsTheOutputCharged(t *testing.T) {
	t.Parallel()
	for name, deltaUsage := range map[string]string{"DeltaWithoutUsage": "", "DeltaUsageWithoutOutput": `{"input_tokens":500}`} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			gate, limit, _ := runAnswered(t, answerWithDeltaUsage(`{"input_tokens":500,"output_tokens":1}`, deltaUsage), true,
				&estimator.Config{PriorWeight: 1})
			// Of the minute's 30 output tokens 16 (max_tokens) are still in use: another 20 wait.
			r, err := gate.ReserveCost(t.Context(), limit, tokens.Cost{OutputTokens: 20})
			require.NoError(t, err)
			require.Greater(t, r.Wait, time.Second, "the output allowance was refunded to message_start's placeholder")
		})
	}
}

// A usage reporting 0 output tokens (an empty answer: a stop sequence met at once) is a real
// count, not a missing one (llm.Usage.OutputUnreported): the output reserved is refunded, as any
// output reported below its allowance. Kept charged, an empty answer held max_tokens of the
// minute's output-token budget it never used.
func TestExecutor_UsageWithZeroOutputRefundsTheOutput(t *testing.T) {
	t.Parallel()
	gate, limit, _ := runCached(t, `{"input_tokens":500,"output_tokens":0}`, false)
	// Of the minute's 30 output tokens none are in use: 20 wait for the request bucket alone
	// (100 a minute: under a second), not for 6 output tokens' refill (12 s).
	r, err := gate.ReserveCost(t.Context(), limit, tokens.Cost{OutputTokens: 20})
	require.NoError(t, err)
	require.Less(t, r.Wait, time.Second, "an answer reporting 0 output tokens kept its allowance charged")
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

// With the estimator's defaults (PriorWeight 1,000 tokens), a tenant's first answer moves its
// ratio from 1.25 by its prompt's size against that weight (estimator.
// TestEstimator_OneSmallAnswerDoesNotSetTheRatio), through the executor as in the estimator: the
// estimate the executor reserved with (est.Raw) is what the answer weighs. The first answer no
// longer sets it outright.
func TestExecutor_FirstAnswerWeighsItsPromptWithTheDefaults(t *testing.T) {
	t.Parallel()
	// ~502 tokens by the rule; the provider counts 401 (a ratio of ~0.8).
	_, _, est := runCachedWith(t, `{"input_tokens":401,"output_tokens":3}`, false, nil)
	const raw = 502.0
	want := 1.25 + raw/(0.8*1000+raw)*(401/raw-1.25) // ~1.076
	require.InDelta(t, want, est.Ratio("cache", "default", "claude-test"), 0.005,
		"the first answer did not weigh its prompt's ~502 tokens against the prior's 1,000")
	require.Equal(t, 1.25, est.Ratio("cache", "other", "claude-test"), "another tenant learned it")
}
