package console_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/httpserve"
	"github.com/llmq/llmq/internal/httpserve/httpservetest"
	"github.com/llmq/llmq/internal/openapitest"
)

// TestActions_BodyReadRefusals: a console action's body that does not arrive within the
// server's read timeout is 408 request_timeout, and one past the console's 1 MiB 413
// body_too_large, as a submit's are, each documented; both were 400 invalid_body, the first
// naming the sockets' addresses ("read tcp 127.0.0.1:...: i/o timeout").
func TestActions_BodyReadRefusals(t *testing.T) {
	t.Parallel()
	b := setup(t)
	hs := httptest.NewUnstartedServer(nil)
	hs.Config = httpserve.NewServer(openapitest.Handler(t, b.h), httpserve.Config{ReadTimeout: 200 * time.Millisecond})
	hs.Start()
	t.Cleanup(hs.Close)

	c := httpservetest.Dial(t, strings.TrimPrefix(hs.URL, "http://"), 0)
	c.Send(t, http.MethodPost, "/console/api/login", "Content-Length: 1000")
	_, err := c.Write([]byte(`{"token":"`)) // then a token that never ends
	require.NoError(t, err)
	defer c.Trickle(20*time.Millisecond, 990)()
	resp := c.Head(t)
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
	requireError(t, resp, string(body), http.StatusRequestTimeout, "request_timeout")
	require.NotContains(t, string(body), "127.0.0.1")
	c.RequireClosed(t)

	// The same once the object has come, with white space trickling after it.
	c = httpservetest.Dial(t, strings.TrimPrefix(hs.URL, "http://"), 0)
	c.Send(t, http.MethodPost, "/console/api/login", "Content-Length: 1000")
	_, err = c.Write([]byte(`{"token":"x"}` + strings.Repeat(" ", 100)))
	require.NoError(t, err)
	resp = c.Head(t)
	body, err = io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
	requireError(t, resp, string(body), http.StatusRequestTimeout, "request_timeout")
	c.RequireClosed(t)

	big := `{"token":"` + strings.Repeat("a", 1<<20) + `"}`
	res, out := b.anonymous(t).do(http.MethodPost, "/console/api/login", rawBody(big), nil)
	requireError(t, res, out, http.StatusRequestEntityTooLarge, "body_too_large")
}
