package batchlane_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/batchlane"
)

// TestClient_FailedBatchSaysWhichLineFailed: an OpenAI batch whose input file failed validation
// fails as a whole, its errors one per bad line (OpenAI's errors.data[].line). Every job of the
// batch is told the batch's reason: the first error's, which names one request, not necessarily
// the job's. The reason keeps the line it names and says how many errors there were, ahead of
// the message (which a cut may shorten), so that a job whose own request was fine does not read
// another request's fault as its own.
func TestClient_FailedBatchSaysWhichLineFailed(t *testing.T) {
	t.Parallel()
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("content-type", "application/json")
		_, _ = io.WriteString(w, `{"id":"batch_1","object":"batch","status":"failed","errors":{"object":"list","data":[
{"code":"invalid_request","message":"Invalid value for 'temperature': must be at most 2.","param":"body.temperature","line":2},
{"code":"invalid_request","message":"Missing required parameter: 'messages'.","param":"body.messages","line":5},
{"code":"invalid_request","message":"Invalid value for 'n'.","param":"body.n","line":9}]}}`)
	}))
	t.Cleanup(ts.Close)
	client, err := batchlane.NewClient("openai", ts.URL, "sk-test", ts.Client())
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	st, err := client.Poll(ctx, "batch_1")
	require.NoError(t, err)
	require.True(t, st.Failed)
	require.Equal(t, "invalid_request", st.ErrorType)
	require.Equal(t, "3 errors, the first on line 2: Invalid value for 'temperature': must be at most 2.", st.Message)
}
