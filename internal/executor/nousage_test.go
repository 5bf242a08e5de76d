package executor_test

import (
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/estimator"
	"github.com/llmq/llmq/internal/tokens"
)

// An answer whose usage reports no count (no usage member, a null one, an empty one, or one of
// zeros: no prompt is 0 tokens) was stored as {"input_tokens":0,"output_tokens":0} on the job
// and its attempt, a cost of nothing that the provider never reported, where the batch lane
// stored none for the same answer (batchlane TestUsageOf_NothingCountedIsNone). Both store none
// (the job's usage null, the attempt's absent), and the limiter keeps the job's estimate charged,
// input and output: what the provider counted is unknown, not 0.
func TestExecutor_AnswerWithoutUsageStoresNone(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		answer http.HandlerFunc
		stream bool
	}{
		{"NoMember", answerWithoutUsage, false},
		{"Null", answerWithDeltaUsage(`null`, ""), false},
		{"Empty", answerWithDeltaUsage(`{}`, ""), false},
		{"Zeros", answerWithDeltaUsage(`{"input_tokens":0,"output_tokens":0}`, ""), false},
		{"StreamWithoutUsage", answerWithDeltaUsage(`null`, ""), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := runAnsweredJob(t, tc.answer, tc.stream, &estimator.Config{PriorWeight: 1})
			require.Nil(t, r.job.Usage, "a usage the provider did not report was stored: %s", r.job.Usage)
			require.Len(t, r.attempts, 1)
			require.Nil(t, r.attempts[0].Usage, "the attempt's: %s", r.attempts[0].Usage)

			// 625 input tokens of the minute's 1,000 and 16 output tokens of its 30 stay in use:
			// 625 more input wait ~15 s, 20 more output ~12 s. Refunded, each waits for the
			// request bucket alone (100 a minute: 0.6 s a request).
			in, err := r.gate.ReserveCost(t.Context(), r.limit, tokens.Cost{InputTokens: 625})
			require.NoError(t, err)
			require.Greater(t, in.Wait, 5*time.Second, "the input estimate was refunded")
			out, err := r.gate.ReserveCost(t.Context(), r.limit, tokens.Cost{OutputTokens: 20})
			require.NoError(t, err)
			require.Greater(t, out.Wait, 5*time.Second, "the output allowance was refunded")
		})
	}
}

// answerWithoutUsage answers as Anthropic does, with no usage member at all (a gateway's).
func answerWithoutUsage(w http.ResponseWriter, r *http.Request) {
	_, _ = io.Copy(io.Discard, r.Body)
	w.Header().Set("Content-Type", "application/json")
	_, _ = io.WriteString(w, `{"id":"msg_1","type":"message","role":"assistant","model":"claude-test",`+
		`"content":[{"type":"text","text":"ok"}],"stop_reason":"end_turn"}`)
}
