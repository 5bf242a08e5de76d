package api

import (
	"context"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/pgtest"
)

// TestServer_StalledStatementIsA503: a statement Postgres does not answer (here a cancel
// waiting for its job's row, which a long transaction holds locked; an I/O stall or a failover
// alike) ends the request at Config.StoreTimeout with 503 unavailable and Retry-After, and
// gives its pool connection back. The cancel waited as long as its client did, holding the
// connection; a poll or a submit was cut by the server's write timeout without an answer.
func TestServer_StalledStatementIsA503(t *testing.T) {
	t.Parallel()
	// 3 s: the requests after the lock is let go get as long, on a loaded machine (-race).
	b := setup(t, setupOpts{noListener: true, storeTimeout: 3 * time.Second})
	ctx := context.Background()
	job := b.create(t, "")

	tx, err := b.pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, `SELECT 1 FROM jobs WHERE id = $1 FOR UPDATE`, job.ID)
	require.NoError(t, err)

	// The lock is held until the answer has come: only a bound can answer, and the message says
	// it was the store's (an unreachable store answers "unavailable" too); do's own deadline
	// (10s, the default StoreTimeout's too) fails a request that waits for nothing else.
	r := b.do(t, http.MethodDelete, "/v1/jobs/"+job.ID, "", nil)
	require.Equal(t, http.StatusServiceUnavailable, r.status, "body %v", r.body)
	require.Equal(t, "unavailable", r.body["error"].(map[string]any)["type"])
	require.Contains(t, r.body["error"].(map[string]any)["message"], "did not answer in time")
	require.NotEmpty(t, r.header.Get("Retry-After"))

	// The stalled statement is gone with its request (pgx's cancel of it, sent as the answer
	// goes, reached Postgres): once the lock is let go, nothing of the refused cancel lands, and
	// the job is polled and canceled as usual.
	pgtest.LockWaitersGone(t, b.pool, "the abandoned cancel")
	require.NoError(t, tx.Rollback(ctx))
	got := b.do(t, http.MethodGet, "/v1/jobs/"+job.ID, "", nil)
	require.Equal(t, http.StatusOK, got.status)
	require.Equal(t, "queued", got.body["status"])
	r = b.do(t, http.MethodDelete, "/v1/jobs/"+job.ID, "", nil)
	require.Equal(t, http.StatusOK, r.status, "body %v", r.body)
	require.Equal(t, "canceled", r.body["status"])
}

// TestServer_SlowBodyIsNotAStoreTimeout: the time a client takes to send its submit body (up to
// the server's read timeout) is not the store's: a body that arrives over longer than
// Config.StoreTimeout, on a store that answers at once, is accepted. The store's deadline ran
// from the request's head, so such a submit (4 MiB over a slow link) was refused 503
// unavailable, "the job store did not answer in time", and logged as the store's fault.
func TestServer_SlowBodyIsNotAStoreTimeout(t *testing.T) {
	t.Parallel()
	const storeTimeout = 3 * time.Second // the submit's own store work on a loaded machine (-race)
	b := setup(t, setupOpts{noListener: true, storeTimeout: storeTimeout})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pr, pw := io.Pipe()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, b.url+"/v1/jobs", pr)
	require.NoError(t, err)
	req.ContentLength = int64(len(minimalSubmit))
	answered := make(chan *http.Response, 1)
	go func() {
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			_ = pw.CloseWithError(err)
			close(answered)
			return
		}
		answered <- resp
	}()
	half := len(minimalSubmit) / 2
	_, err = io.WriteString(pw, minimalSubmit[:half])
	require.NoError(t, err)
	// A slow client: the rest of its body comes well after the store's deadline would have.
	select {
	case <-time.After(2 * storeTimeout):
	case <-ctx.Done():
		t.Fatal(ctx.Err())
	}
	_, err = io.WriteString(pw, minimalSubmit[half:])
	require.NoError(t, err)
	require.NoError(t, pw.Close())
	resp, ok := <-answered
	require.True(t, ok, "no answer")
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.Equal(t, http.StatusAccepted, resp.StatusCode, "body %s", raw)
}

// TestServer_LockTimeoutIsA503: an operator who sets a lock_timeout on the API's sessions
// (database_url's options) has a statement that waits for a row lock past it refused by
// Postgres (55P03 lock_not_available); the request is answered 503 unavailable with
// Retry-After, as its statement_timeout's is, not 500 internal: nothing is wrong with the
// request, and its retry may well pass.
func TestServer_LockTimeoutIsA503(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{noListener: true, dbURL: pgtest.URL(t) + "&options=-c%20lock_timeout%3D100ms"})
	ctx := context.Background()
	job := b.create(t, "")

	tx, err := b.pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, `SELECT 1 FROM jobs WHERE id = $1 FOR UPDATE`, job.ID)
	require.NoError(t, err)

	r := b.do(t, http.MethodDelete, "/v1/jobs/"+job.ID, "", nil)
	require.Equal(t, http.StatusServiceUnavailable, r.status, "body %v", r.body)
	require.Equal(t, "unavailable", r.body["error"].(map[string]any)["type"])
	require.NotEmpty(t, r.header.Get("Retry-After"))

	require.NoError(t, tx.Rollback(ctx))
	r = b.do(t, http.MethodDelete, "/v1/jobs/"+job.ID, "", nil)
	require.Equal(t, http.StatusOK, r.status, "body %v", r.body)
}
