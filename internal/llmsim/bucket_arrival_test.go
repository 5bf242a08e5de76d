package llmsim_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/llmsim"
)

// hookedBody is a request body that runs hook on its first Read, before yielding its bytes.
type hookedBody struct {
	r    io.Reader
	hook func()
}

func (b *hookedBody) Read(p []byte) (int, error) {
	if b.hook != nil {
		h := b.hook
		b.hook = nil
		h()
	}
	return b.r.Read(p)
}

// A request whose body arrives slowly, while a later request takes the bucket's token, is
// charged when its body has arrived, not when it began: charging it at its start would set it
// before the later request and refuse it against a debt that already counts that request
// (under load, the herd bench saw such 429s from a limiter pacing exactly at the bucket).
func TestServer_BucketChargesWhenTheRequestIsAdmitted(t *testing.T) {
	t.Parallel()
	// Given a bucket of 1 refilling at 1/s on a fake clock
	b := setup(t, llmsim.Config{Capacity: 1, RefillPerSecond: 1})

	// When request A starts, and while its body is still on its way a second passes, request B
	// takes the token, and another second passes (the bucket is full again)
	var bStatus int
	body := &hookedBody{r: strings.NewReader(helloBody), hook: func() {
		b.clock.Advance(time.Second)
		bStatus = b.anthropic(t, "key-a", helloBody).status
		b.clock.Advance(time.Second)
	}}
	req := httptest.NewRequest(http.MethodPost, "/v1/messages", body)
	req.Header.Set("anthropic-version", "2023-06-01")
	req.Header.Set("content-type", "application/json")
	req.Header.Set("x-api-key", "key-a")
	rec := httptest.NewRecorder()
	b.sim.ServeHTTP(rec, req)

	// Then both are answered: B took the token the bucket started with, A the one refilled since
	require.Equal(t, http.StatusOK, bStatus)
	require.Equal(t, http.StatusOK, rec.Code, "body: %s", rec.Body)
	require.Equal(t, "0", rec.Header().Get("anthropic-ratelimit-requests-remaining"))
	require.Equal(t, "2026-01-02T03:04:08.000Z", rec.Header().Get("anthropic-ratelimit-requests-reset"))
}
