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
		case <-time.After(10 * time.Second):
			t.Fatalf("%s did not happen within 10s", what)
		}
	}
	wait(started, "the request")

	cancel()
	select {
	case err := <-served:
		require.NoError(t, err, "a shutdown that cut a request past its timeout")
	case <-time.After(10 * time.Second):
		t.Fatal("serve did not return within 10s")
	}
	wait(ended, "the cut request's end")
	select {
	case err := <-answered:
		require.Error(t, err, "the cut request's client sees its connection closed")
	case <-time.After(10 * time.Second):
		t.Fatal("the cut request's client did not return within 10s")
	}
}
