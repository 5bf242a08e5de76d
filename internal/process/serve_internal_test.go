package process

import (
	"context"
	"log/slog"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/httpserve"
)

// TestServer_ShutdownCutsRequestsPastItsTimeout: a request still under way when the shutdown
// timeout ends (a slow client's upload, a submit stalled on Postgres) is cut, its context ended
// so that it does not outlive the stores the process closes next, and serve returns nil: the
// cut is the shutdown the operations guide describes, and a process stopped for a rolling
// restart must not exit 1 ("shut the HTTP server down: context deadline exceeded") for it.
func TestServer_ShutdownCutsRequestsPastItsTimeout(t *testing.T) {
	t.Parallel()
	started, ended := make(chan struct{}), make(chan struct{})
	handler := http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
		close(started)
		<-r.Context().Done() // a request that would outlast the shutdown timeout
		close(ended)
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	s := &server{srv: httpserve.NewServer(handler, httpserve.Config{}), ln: ln,
		log: slog.New(slog.DiscardHandler), grace: 100 * time.Millisecond}
	t.Cleanup(func() { _ = s.srv.Close() }) // a failed test leaves no request behind

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	served := make(chan error, 1)
	go func() { served <- s.serve(ctx) }()
	answered := make(chan error, 1)
	go func() {
		c := &http.Client{Timeout: 20 * time.Second}
		resp, err := c.Get("http://" + ln.Addr().String() + "/")
		if err == nil {
			resp.Body.Close()
		}
		answered <- err
	}()
	wait := func(ch <-chan struct{}, what string) {
		t.Helper()
		select {
		case <-ch:
		case <-time.After(30 * time.Second):
			t.Fatalf("%s did not happen within 30s", what)
		}
	}
	wait(started, "the request")

	cancel()
	select {
	case err := <-served:
		require.NoError(t, err, "a shutdown that cut a request past its timeout")
	case <-time.After(30 * time.Second):
		t.Fatal("serve did not return within 30s")
	}
	wait(ended, "the cut request's end")
	select {
	case err := <-answered:
		require.Error(t, err, "the cut request's client sees its connection closed")
	case <-time.After(30 * time.Second):
		t.Fatal("the cut request's client did not return within 30s")
	}
}

// TestServer_DrainsBeforeItStopsListening: with a drain delay (api.drain_delay), a stopping
// API first tells its load balancer it is going (drain: /readyz answers 503) and goes on
// accepting connections for the delay, so that a client the balancer still sends here is
// answered, not refused; only then does it stop listening. Without it the listener closed at
// the signal, while the balancer, not yet told, still sent requests that were refused.
func TestServer_DrainsBeforeItStopsListening(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	drained, release := make(chan struct{}), make(chan time.Time)
	asked := make(chan time.Duration, 1)
	s := &server{srv: httpserve.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusNoContent)
	}), httpserve.Config{}), ln: ln, log: slog.New(slog.DiscardHandler), grace: time.Second,
		drainDelay: 5 * time.Second, drain: func() { close(drained) },
		after: func(d time.Duration) <-chan time.Time { asked <- d; return release }}
	t.Cleanup(func() { _ = s.srv.Close() })

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	served := make(chan error, 1)
	go func() { served <- s.serve(ctx) }()
	cancel()
	select {
	case <-drained:
	case err := <-served:
		t.Fatalf("serve returned (%v) without draining first", err)
	case <-time.After(30 * time.Second):
		t.Fatal("serve did not drain within 30s of the stop")
	}
	// A new connection during the drain delay is served (the balancer may still send one).
	c := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := c.Get("http://" + ln.Addr().String() + "/")
	require.NoError(t, err, "a request during the drain delay")
	resp.Body.Close()
	require.Equal(t, http.StatusNoContent, resp.StatusCode)
	select {
	case d := <-asked:
		require.Equal(t, 5*time.Second, d, "the drain delay waited for")
	case <-time.After(30 * time.Second):
		t.Fatal("serve did not wait for its drain delay")
	}
	select {
	case err := <-served:
		t.Fatalf("serve returned (%v) before its drain delay ended", err)
	default:
	}
	close(release)
	select {
	case err := <-served:
		require.NoError(t, err)
	case <-time.After(30 * time.Second):
		t.Fatal("serve did not return within 30s of the drain delay's end")
	}
	_, err = c.Get("http://" + ln.Addr().String() + "/")
	require.Error(t, err, "the listener is closed once the drain delay has passed")
}
