package httpserve_test

import (
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/llmq/llmq/internal/httpserve"
	"github.com/llmq/llmq/internal/httpserve/httpservetest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// serve runs h on a loopback listener (capped at maxConns when positive) until the test ends,
// and returns its address.
func serve(t *testing.T, h http.Handler, cfg httpserve.Config, maxConns int, metrics *httpserve.Metrics) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	if maxConns > 0 {
		ln = httpserve.LimitListener(ln, maxConns, metrics)
	}
	srv := httpserve.NewServer(h, cfg)
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	t.Cleanup(func() {
		require.NoError(t, srv.Close())
		require.ErrorIs(t, <-done, http.ErrServerClosed)
	})
	return ln.Addr().String()
}

var ok = http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok") })

func TestNewServer_TrickledBodyIsCutOff(t *testing.T) {
	t.Parallel()
	readErr := make(chan error, 1)
	addr := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, err := io.ReadAll(r.Body)
		readErr <- err
		w.WriteHeader(http.StatusRequestTimeout)
	}), httpserve.Config{ReadTimeout: 200 * time.Millisecond}, 0, nil)

	c := httpservetest.Dial(t, addr, 0)
	c.Send(t, http.MethodPost, "/", "Content-Length: 1000")
	defer c.Trickle(20*time.Millisecond, 1000)() // 20 s for the whole body

	require.Equal(t, http.StatusRequestTimeout, c.Response(t).StatusCode)
	var ne net.Error
	require.ErrorAs(t, <-readErr, &ne)
	require.True(t, ne.Timeout(), "the handler's read ended on the server's deadline: %v", ne)
	c.RequireClosed(t)
}

func TestNewServer_IdleKeepAliveConnectionIsClosed(t *testing.T) {
	t.Parallel()
	addr := serve(t, ok, httpserve.Config{IdleTimeout: 100 * time.Millisecond}, 0, nil)
	c := httpservetest.Dial(t, addr, 0)
	require.Equal(t, http.StatusOK, c.Get(t, "/").StatusCode)
	c.RequireClosed(t)
}

func TestNewServer_StalledReaderIsCutOff(t *testing.T) {
	t.Parallel()
	wrote := make(chan error, 1)
	big := strings.Repeat("x", 16<<20) // more than the socket buffers of a client that reads nothing hold
	addr := serve(t, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, err := io.WriteString(w, big)
		wrote <- err
	}), httpserve.Config{WriteTimeout: 200 * time.Millisecond}, 0, nil)
	httpservetest.Dial(t, addr, 0).Send(t, http.MethodGet, "/")
	// The client reads nothing: the handler's write must fail on the deadline.
	select {
	case err := <-wrote:
		require.ErrorIs(t, err, os.ErrDeadlineExceeded)
	case <-time.After(httpservetest.Deadline):
		t.Fatal("the handler is still writing to a client that reads nothing")
	}
}

func TestLimitListener_OneConnectionOverTheCap(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	metrics := httpserve.NewMetrics(reg)
	addr := serve(t, ok, httpserve.Config{}, 2, metrics)

	first, second := httpservetest.Dial(t, addr, 0), httpservetest.Dial(t, addr, 0)
	require.Equal(t, http.StatusOK, first.Get(t, "/").StatusCode)
	require.Equal(t, http.StatusOK, second.Get(t, "/").StatusCode)

	over := httpservetest.Dial(t, addr, 0)
	resp := over.Get(t, "/")
	require.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
	require.Equal(t, "1", resp.Header.Get("Retry-After"))
	over.RequireClosed(t)
	require.Equal(t, http.StatusOK, first.Get(t, "/").StatusCode, "the connections under the cap are still served")

	// A place frees when a connection closes.
	require.NoError(t, second.Close())
	// (each probe on a connection of its own; a probe that failed, over the cap still or cut off
	// before its answer was read, is tried again rather than failing the test from the
	// condition's goroutine)
	probe := &http.Client{Timeout: httpservetest.Deadline, Transport: &http.Transport{DisableKeepAlives: true}}
	require.Eventually(t, func() bool {
		resp, err := probe.Get("http://" + addr + "/")
		if err != nil {
			return false
		}
		_ = resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}, httpservetest.Wait, 10*time.Millisecond, "a place frees when a connection closes")
	// The server notices closed connections on its own time.
	require.Eventually(t, func() bool { return gauge(t, reg, "llmq_http_connections_open") == 1 }, httpservetest.Wait, 10*time.Millisecond,
		"first is open; second and the probes closed")
	require.GreaterOrEqual(t, gauge(t, reg, "llmq_http_connections_rejected_total"), 1.0)
}

// TestLimitListener_HeadOverTheCapHasNoBody: the 503 of a connection over the cap is the answer
// to the request it carries, so a HEAD's has no body (RFC 9110 §9.3.2); a GET's has the error
// document.
func TestLimitListener_HeadOverTheCapHasNoBody(t *testing.T) {
	t.Parallel()
	addr := serve(t, ok, httpserve.Config{}, 1, nil)
	held := httpservetest.Dial(t, addr, 0)
	require.Equal(t, http.StatusOK, held.Get(t, "/").StatusCode)

	for _, method := range []string{http.MethodHead, http.MethodGet} {
		over := httpservetest.Dial(t, addr, 0)
		over.Send(t, method, "/")
		raw, err := io.ReadAll(over) // the whole answer, to the close
		require.NoError(t, err)
		head, body, found := strings.Cut(string(raw), "\r\n\r\n")
		require.True(t, found, "%s: %q", method, raw)
		require.True(t, strings.HasPrefix(head, "HTTP/1.1 503 "), "%s: %q", method, head)
		require.Contains(t, head, "\r\nRetry-After: 1", method)
		if method == http.MethodHead {
			require.Empty(t, body, "HEAD answered with a body")
		} else {
			require.Contains(t, body, `"type":"overloaded"`)
		}
	}
}

// gauge returns the value of the gauge or counter without labels called name.
func gauge(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	families, err := reg.Gather()
	require.NoError(t, err)
	for _, f := range families {
		if f.GetName() == name {
			m := f.GetMetric()[0]
			return m.GetGauge().GetValue() + m.GetCounter().GetValue()
		}
	}
	t.Fatalf("no metric %s", name)
	return 0
}

func TestDefaultMaxConnections(t *testing.T) {
	t.Parallel()
	n := httpserve.DefaultMaxConnections()
	require.GreaterOrEqual(t, n, 1)
	require.LessOrEqual(t, n, httpserve.MaxDefaultConnections)
}
