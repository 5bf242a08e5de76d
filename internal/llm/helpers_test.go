package llm_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/llm"
)

const testKey = "sk-test-0123456789abcdef-SECRET"

var testNow = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// testWait bounds each wait of a test whose end the code under test decides (a timeout, a
// cancellation, a wake-up): a regression there fails the test after it instead of hanging the
// package until go test's -timeout.
const testWait = 30 * time.Second

// pausedBody answers 200 with an Anthropic answer's first bytes at once, then the rest after
// pause (nothing once the client has gone).
func pausedBody(pause time.Duration) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(200)
		_, _ = io.WriteString(w, `{"usage":`)
		w.(http.Flusher).Flush()
		select {
		case <-time.After(pause):
		case <-r.Context().Done():
			return
		}
		_, _ = io.WriteString(w, `{"input_tokens":1,"output_tokens":1}}`)
	}
}

// callContext returns t's context, ended after testWait.
func callContext(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), testWait)
	t.Cleanup(cancel)
	return ctx
}

// within returns what ch yields, failing the test unless it does within testWait.
func within[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(testWait):
		t.Fatalf("no %s within %s", what, testWait)
		panic("unreachable")
	}
}

// testBundle is one scripted provider and a Provider pointed at it.
type testBundle struct {
	srv      *httptest.Server
	provider llm.Provider
}

type bundleOpts struct {
	now      func() time.Time
	maxBytes int64
	base     string // appended to the server URL
	// wrap, when set, wraps the test server's client transport.
	wrap func(http.RoundTripper) http.RoundTripper
	// budget, when set, is the provider's answer budget.
	budget *llm.AnswerBudget
}

func setup(t *testing.T, kind llm.Kind, h http.HandlerFunc, opts ...bundleOpts) *testBundle {
	t.Helper()

	var o bundleOpts
	if len(opts) > 0 {
		o = opts[0]
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	hc := srv.Client()
	if o.wrap != nil {
		hc = &http.Client{Transport: o.wrap(hc.Transport)}
	}
	p, err := llm.New(llm.Config{
		Kind:             kind,
		BaseURL:          srv.URL + o.base,
		APIKey:           testKey,
		HTTPClient:       hc,
		Now:              o.now,
		MaxResponseBytes: o.maxBytes,
		AnswerBudget:     o.budget,
	})
	require.NoError(t, err)
	return &testBundle{srv: srv, provider: p}
}

// fixedClock always returns testNow.
func fixedClock() time.Time { return testNow }

// steppingClock returns a clock that advances by step on every call.
func steppingClock(step time.Duration) func() time.Time {
	var mu sync.Mutex
	now := testNow
	return func() time.Time {
		mu.Lock()
		defer mu.Unlock()
		now = now.Add(step)
		return now
	}
}

// reply writes status, headers (pairs) and body.
func reply(status int, body string, kv ...string) http.HandlerFunc {
	return func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Date", testNow.Format(http.TimeFormat)) // the provider's clock: the tests'
		for i := 0; i < len(kv); i += 2 {
			w.Header().Add(kv[i], kv[i+1])
		}
		if w.Header().Get("Content-Type") == "" {
			w.Header().Set("Content-Type", "application/json")
		}
		w.WriteHeader(status)
		_, _ = w.Write([]byte(body))
	}
}

func requireNoSecret(t *testing.T, err error) {
	t.Helper()
	require.Error(t, err)
	require.NotContains(t, err.Error(), testKey)
	require.NotContains(t, err.Error(), "hello from the prompt")
}

const anthropicBody = `{"model":"claude-test",  "max_tokens":16,"messages":[{"role":"user","content":"hello from the prompt"}]}`

const openAIBody = `{"messages":[{"role":"user","content":"hello from the prompt"}],"model":"gpt-test"}`

func bodyFor(kind llm.Kind) []byte {
	if kind == llm.KindOpenAI {
		return []byte(openAIBody)
	}
	return []byte(anthropicBody)
}

func asStatusError(t *testing.T, err error) *llm.StatusError {
	t.Helper()
	se, ok := errors.AsType[*llm.StatusError](err)
	require.True(t, ok, "want *llm.StatusError, got %T: %v", err, err)
	return se
}

func asTransportError(t *testing.T, err error) *llm.TransportError {
	t.Helper()
	te, ok := errors.AsType[*llm.TransportError](err)
	require.True(t, ok, "want *llm.TransportError, got %T: %v", err, err)
	return te
}

// roundTripFunc adapts a function to http.RoundTripper.
type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }
