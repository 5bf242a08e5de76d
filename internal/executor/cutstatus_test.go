package executor_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/dispatch"
	"github.com/llmq/llmq/internal/executor"
	"github.com/llmq/llmq/internal/jobs"
	"github.com/llmq/llmq/internal/jobstest"
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

// A body not streamed that was cut short after its first byte came was answered, and had begun:
// its row kept the 200 but ttfb_ms null, as if no byte had come (the time to the first byte was
// known only for a stream's delta). The row records the time to the body's first byte.
func TestExecutor_CutBodyAttemptKeepsItsTimeToFirstByte(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := jobstest.New(t)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		conn, buf, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		_, _ = buf.WriteString("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{\"id\":\"msg_")
		_ = buf.Flush()
		_ = conn.Close()
	}))
	t.Cleanup(srv.Close)
	p, err := llm.New(llm.Config{Kind: llm.KindAnthropic, BaseURL: srv.URL, APIKey: "sk-cut"})
	require.NoError(t, err)
	ex := executor.New(executor.Config{Store: b.Store, Policy: retrypolicy.New(nil),
		Upstreams: map[string]executor.Upstream{"gw": {Name: "gw", Kind: string(llm.KindAnthropic), Provider: p}}})
	job, _, err := b.Store.Create(ctx, jobs.CreateParams{Tenant: "default", Credential: "gw", MaxAttempts: 1, Timeout: time.Minute,
		Request: json.RawMessage(`{"model":"claude-test","max_tokens":16,"messages":[{"role":"user","content":"hi"}]}`)})
	require.NoError(t, err)
	_ = ex.Process(ctx, dispatch.Delivery{JobID: job.ID}) // the job's end is not what this reads
	attempts, err := b.Store.Attempts(ctx, job.ID)
	require.NoError(t, err)
	require.Len(t, attempts, 1)
	a := attempts[0]
	require.Equal(t, string(retrypolicy.ClassNetwork), a.Class, "the cut is the attempt's class")
	require.NotNil(t, a.StatusCode)
	require.Equal(t, http.StatusOK, *a.StatusCode)
	require.NotNil(t, a.TTFBMS, "the row reads as if no body byte had come")
	require.Positive(t, *a.TTFBMS)
	require.LessOrEqual(t, *a.TTFBMS, a.LatencyMS)
}
