package executor_test

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/llm"
	"github.com/llmq/llmq/internal/llmsim"
	"github.com/llmq/llmq/internal/retrypolicy"
)

// A stream cut partway was answered: its headers came with a 200 before the cut. Its attempt's
// row recorded status_code null (the status comes from the error's classification, and a
// transport error has none), which reads as a call the provider never answered. The row keeps
// the 200, whether the cut came after a delta (ttfb_ms set) or before any (ttfb_ms null: the
// headers came, no delta did).
func TestExecutor_CutStreamAttemptKeepsItsStatus(t *testing.T) {
	t.Parallel()
	for _, after := range []int{0, 2} {
		t.Run(fmt.Sprintf("after %d tokens", after), func(t *testing.T) {
			t.Parallel()
			a, got := failedStreamAttempt(t, llm.KindOpenAI, llmsim.Faults{StreamFailNext: 1, StreamFailAfter: after,
				StreamFailMode: llmsim.StreamFailCut})
			require.Equal(t, string(retrypolicy.ClassNetwork), a.Class, "the cut is still the attempt's class")
			require.NotNil(t, a.StatusCode, "the row reads as a call the provider never answered")
			require.Equal(t, 200, *a.StatusCode)
			require.Equal(t, after > 0, a.TTFBMS != nil, "ttfb_ms is the time to the first delta, when one came")
			require.NotNil(t, got.LastError)
			require.Zero(t, got.LastError.Status, "last_error's status is the failure's, and a cut has none")
		})
	}
}
