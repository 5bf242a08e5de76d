package api

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/llmq/llmq/internal/logtest"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
)

// TestInstrument_PanicIsA500: a handler's panic is answered 500 internal in the API's error
// shape, logged once with its stack and counted as a 500 in llmq_http_responses_total (what the
// LLMQAPIServerErrors rule reads); a panic once the answer has begun cuts the connection and is
// counted as a 500 too; http.ErrAbortHandler is left to net/http (the connection cut, nothing
// logged by the API, nothing counted).
func TestInstrument_PanicIsA500(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	var logs logtest.Buffer
	console := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/console/boom":
			panic("a bug in a handler")
		case "/console/late":
			w.Header().Set("Content-Type", "text/plain")
			w.WriteHeader(http.StatusOK)
			_, _ = io.WriteString(w, "half an answer")
			_ = http.NewResponseController(w).Flush() // on the wire: the client sees it begun
			panic("a bug halfway through an answer")
		case "/console/abort":
			panic(http.ErrAbortHandler)
		}
	})
	m := NewMetrics(reg)
	s := New(Config{Metrics: m, Gatherer: reg, Console: console,
		Logger: slog.New(slog.NewJSONHandler(&logs, nil))})
	hs := httptest.NewUnstartedServer(s)
	hs.Config.ErrorLog = log.New(io.Discard, "", 0) // net/http's own report of a panic it recovers
	hs.Start()
	t.Cleanup(hs.Close)
	get := func(path string) (*http.Response, []byte, error) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, hs.URL+path, nil)
		require.NoError(t, err)
		resp, err := hs.Client().Do(req)
		if err != nil {
			return nil, nil, err
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		return resp, body, err
	}
	served500 := func() float64 {
		return testutil.ToFloat64(m.responses.WithLabelValues("/console/", "500"))
	}

	resp, body, err := get("/console/boom")
	require.NoError(t, err, "the panic is answered, not a cut connection")
	require.Equal(t, http.StatusInternalServerError, resp.StatusCode)
	require.Equal(t, "application/json", resp.Header.Get("Content-Type"))
	var answer struct {
		Error struct{ Type, Message string } `json:"error"`
	}
	require.NoError(t, json.Unmarshal(body, &answer), "%s", body)
	require.Equal(t, "internal", answer.Error.Type)
	require.NotContains(t, answer.Error.Message, "a bug", "the panic is logged, not answered")
	require.EqualValues(t, 1, served500())
	require.Equal(t, 1, strings.Count(logs.String(), "a bug in a handler"), "logged once: %s", logs.String())
	require.Contains(t, logs.String(), "panic_test.go", "with its stack")

	_, _, err = get("/console/late")
	require.Error(t, err, "an answer begun is cut, not ended as if whole")
	require.EqualValues(t, 2, served500())
	require.Equal(t, 1, strings.Count(logs.String(), "a bug halfway through an answer"))

	_, _, err = get("/console/abort")
	require.Error(t, err, "http.ErrAbortHandler cuts the connection")
	require.False(t, errors.Is(err, context.DeadlineExceeded), "%v", err)
	require.EqualValues(t, 2, served500(), "a deliberate abort is no server error")
	require.NotContains(t, logs.String(), "abort Handler")
}
