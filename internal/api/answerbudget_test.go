package api

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/httpserve/httpservetest"
	"github.com/llmq/llmq/internal/jobs"
)

// heldWriteListener wraps a server's listener so that the first large write on any of its
// connections (a job's answer with its result) waits until release is closed, as a write to a
// client that never reads does once its TCP window is full; held is closed when it starts
// waiting. Every other write goes through.
type heldWriteListener struct {
	net.Listener
	once    sync.Once
	held    chan struct{}
	release chan struct{}
}

func (l *heldWriteListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &heldWriteConn{Conn: c, l: l}, nil
}

type heldWriteConn struct {
	net.Conn
	l *heldWriteListener
}

func (c *heldWriteConn) Write(p []byte) (int, error) {
	if len(p) >= 32<<10 {
		first := false
		c.l.once.Do(func() { first = true })
		if first {
			close(c.l.held)
			<-c.l.release
		}
	}
	return c.Conn.Write(p)
}

// heldAnswers is a server of which a tenant's share of the answers' budget (128 KiB) has room
// for one answer of largeResult (100 KiB), and whose first large write waits for release (or the
// test's end, before the server's shutdown, which waits for it).
type heldAnswers struct {
	*testBundle
	ln      *heldWriteListener
	release func()
}

func newHeldAnswers(t *testing.T) *heldAnswers {
	t.Helper()
	h := &heldAnswers{ln: &heldWriteListener{held: make(chan struct{}), release: make(chan struct{})}}
	h.release = sync.OnceFunc(func() { close(h.ln.release) })
	h.testBundle = setup(t, setupOpts{maxBody: 64 << 10, maxBodyInFlight: 256 << 10,
		listener: func(inner net.Listener) net.Listener { h.ln.Listener = inner; return h.ln }})
	t.Cleanup(h.release) // runs before setup's shutdown
	return h
}

// largeResult is a job result of 100 KiB.
func largeResult(t *testing.T) json.RawMessage {
	t.Helper()
	result, err := json.Marshal(map[string]string{"text": strings.Repeat("x", 100<<10)})
	require.NoError(t, err)
	return result
}

// holdPoll sends a poll of job id whose client does not read its answer, and returns once the
// answer's write is held; its Response is read after release.
func (h *heldAnswers) holdPoll(t *testing.T, id string, header ...string) *httpservetest.Conn {
	t.Helper()
	held := httpservetest.Dial(t, strings.TrimPrefix(h.url, "http://"), 0)
	held.Send(t, http.MethodGet, "/v1/jobs/"+id, header...)
	select {
	case <-h.ln.held:
	case <-time.After(httpservetest.Wait):
		t.Fatal("the held poll's answer was never written")
	}
	return held
}

// TestGet_LargeAnswersHeldWithinBudget: the polls of jobs with large results that one replica
// is answering at once hold at most api.max_body_bytes_in_flight of results between them, one
// tenant at most half of it: a poll past its tenant's half is 429 too_many_answers, while
// another tenant's is answered. Polls had no bound but the connections: 100 polls of a job
// with a 12 MB result by a client that never read them held 1.5 GB until the write timeout.
func TestGet_LargeAnswersHeldWithinBudget(t *testing.T) {
	t.Parallel()
	b := newHeldAnswers(t)
	ctx, cancel := context.WithTimeout(context.Background(), httpservetest.Wait)
	defer cancel()
	_, token, err := b.tenants.Create(ctx, "acme", nil)
	require.NoError(t, err)
	acme := map[string]string{"Authorization": "Bearer " + token}
	result := largeResult(t)
	large := func(tenant string) *jobs.Job {
		job := b.create(t, tenant)
		b.attempt(t, job.ID, jobs.Outcome{Status: jobs.StatusSucceeded, Result: result})
		return job
	}
	own, other := large("acme"), large("default")

	held := b.holdPoll(t, own.ID, "Authorization: Bearer "+token)
	requireError(t, b.do(t, http.MethodGet, "/v1/jobs/"+own.ID, "", acme), http.StatusTooManyRequests, "too_many_answers")
	require.Equal(t, http.StatusOK, b.do(t, http.MethodGet, "/v1/jobs/"+other.ID, "", nil).status,
		"another tenant's poll waited for this one's reader")

	b.release()
	resp := held.Response(t)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.NoError(t, resp.Body.Close())
	require.Eventually(t, func() bool {
		return b.do(t, http.MethodGet, "/v1/jobs/"+own.ID, "", acme).status == http.StatusOK
	}, httpservetest.Wait, 5*time.Millisecond, "the held answer's bytes were not given back")
}

// TestSubmit_ReplayOfALargeResultHeldWithinBudget: a replayed submit answers its job's result, as
// a poll does, within the same budget: past its tenant's half of it, 429 too_many_answers, with no
// Location (the job is not answered); once the held answer is written, the replay is served.
// Replays had no bound but the connections, as polls had.
func TestSubmit_ReplayOfALargeResultHeldWithinBudget(t *testing.T) {
	t.Parallel()
	b := newHeldAnswers(t)
	const body = `{"request":{"model":"m","max_tokens":5}}`
	key := map[string]string{"Idempotency-Key": "large-replay"}
	first := b.do(t, http.MethodPost, "/v1/jobs", body, key)
	require.Equal(t, http.StatusAccepted, first.status, "%v", first.body)
	id := first.body["id"].(string)
	b.attempt(t, id, jobs.Outcome{Status: jobs.StatusSucceeded, Result: largeResult(t)})

	held := b.holdPoll(t, id) // holds the tenant's half
	refused := b.do(t, http.MethodPost, "/v1/jobs", body, key)
	requireError(t, refused, http.StatusTooManyRequests, "too_many_answers")
	require.Empty(t, refused.header.Get("Location"), "a refused replay names no job")

	b.release()
	resp := held.Response(t)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.NoError(t, resp.Body.Close())
	require.Eventually(t, func() bool {
		again := b.do(t, http.MethodPost, "/v1/jobs", body, key)
		return again.status == http.StatusOK && again.body["id"] == id && again.header.Get("Idempotent-Replayed") == "true"
	}, httpservetest.Wait, 5*time.Millisecond, "the held answer's bytes were not given back")
}
