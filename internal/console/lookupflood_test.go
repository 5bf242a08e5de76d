package console_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/console"
	"github.com/llmq/llmq/internal/operator"
	"github.com/llmq/llmq/internal/pgtest"
	"github.com/llmq/llmq/internal/secrettoken"
)

// TestSession_MadeUpCookieFloodLeavesRoomForOthers: every console request with a session cookie
// looked the cookie up in Postgres, on the pool the API shares, before anything said who the
// client was. A client without any credential, sending made-up (well-formed) cookies while
// Postgres was slow (here: behind a lock of the sessions table), held as many pool connections as
// it had requests in flight, and the pool's other users (the API's tenants' polls, submits and
// cancels) found none free. Now the lookups of cookies never found live hold at most a quarter of
// the pool (one of four); the excess waits for a place up to LookupWait, then is answered 503
// overloaded with Retry-After, and the rest of the pool stays free. An operator's session, once
// found live (by a request, or by its login), is looked up without a place: she keeps the
// console through the flood.
func TestSession_MadeUpCookieFloodLeavesRoomForOthers(t *testing.T) {
	t.Parallel()
	b, pool := setupFourConns(t, 0)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// alice's session, found live once: her next requests look it up without a place.
	alice := b.login(t)
	res, body := alice.do(http.MethodGet, "/console/api/session", nil, nil)
	require.Equal(t, http.StatusOK, res.StatusCode, body)
	u, err := url.Parse(b.srv.URL + "/console/")
	require.NoError(t, err)
	cookies := alice.http.Jar.Cookies(u)
	require.Len(t, cookies, 1)
	// alice has logged in from another browser too, and asked nothing yet with that session: its
	// login found it live.
	fresh := b.login(t)
	freshCookies := fresh.http.Jar.Cookies(u)
	require.Len(t, freshCookies, 1)

	// A transaction outside the pool locks the sessions table: every cookie's lookup waits for
	// it in Postgres, holding its connection.
	conn, err := pgx.Connect(ctx, b.jobs.URL)
	require.NoError(t, err)
	defer conn.Close(context.Background())
	var wg sync.WaitGroup
	defer wg.Wait() // after the rollback, which ends the lookups still waiting
	tx, err := conn.Begin(ctx)
	require.NoError(t, err)
	rollback := sync.OnceFunc(func() { require.NoError(t, tx.Rollback(ctx)) })
	defer rollback()
	_, err = tx.Exec(ctx, `LOCK TABLE operator_sessions IN ACCESS EXCLUSIVE MODE`)
	require.NoError(t, err)
	watch, err := pgx.Connect(ctx, b.jobs.URL)
	require.NoError(t, err)
	defer watch.Close(context.Background())

	const flood = 4 // the pool's size
	answers := make(chan cookieAnswer, flood)
	for range flood {
		cookie, err := secrettoken.New(nil, "")
		require.NoError(t, err)
		wg.Go(func() { answers <- sessionWith(ctx, b.srv.URL, cookie) })
	}
	// Every lookup of the flood is either waiting in Postgres or answered.
	answered := pgtest.LockWaitingOrAnswered(ctx, t, watch, answers, flood, "the flood's lookups")

	// The pool has room for its other users while the flood holds on.
	acquireCtx, cancelAcquire := context.WithTimeout(ctx, 30*time.Second)
	defer cancelAcquire()
	c, err := pool.Acquire(acquireCtx)
	require.NoError(t, err, "a connection of the pool while made-up cookies flood the console")
	c.Release()

	// The flood's excess waited for a place up to its bound: 503 overloaded, Retry-After.
	require.Len(t, answered, flood-1, "a quarter of the pool (one connection) looks cookies up")
	for _, a := range answered {
		require.Equal(t, http.StatusServiceUnavailable, a.status, a.body)
		require.Contains(t, a.body, `"overloaded"`)
		require.Equal(t, "1", a.retryAfter)
	}

	// alice's requests with both sessions, the places still full, are not refused: they wait in
	// Postgres beside the flood's lookup, and are answered once Postgres answers.
	aliceAnswer := make(chan cookieAnswer, 1)
	freshAnswer := make(chan cookieAnswer, 1)
	wg.Go(func() { aliceAnswer <- sessionWith(ctx, b.srv.URL, cookies[0].Value) })
	wg.Go(func() { freshAnswer <- sessionWith(ctx, b.srv.URL, freshCookies[0].Value) })
	for waiting := 0; waiting < 3; {
		select {
		case a := <-aliceAnswer:
			t.Fatalf("alice's session answered while Postgres waits: %d %s", a.status, a.body)
		case a := <-freshAnswer:
			t.Fatalf("the new session's first request, just logged in, answered while Postgres waits: %d %s", a.status, a.body)
		case <-time.After(10 * time.Millisecond):
		case <-ctx.Done():
			t.Fatal("alice's lookup did not reach Postgres")
		}
		require.NoError(t, watch.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&waiting))
	}
	rollback()
	for _, want := range []struct {
		answers <-chan cookieAnswer
		status  int
		typ     string
	}{{answers, http.StatusUnauthorized, `"session_expired"`}, {aliceAnswer, http.StatusOK, `"operator":"alice"`},
		{freshAnswer, http.StatusOK, `"operator":"alice"`}} {
		select {
		case a := <-want.answers:
			require.Equal(t, want.status, a.status, a.body)
			require.Contains(t, a.body, want.typ)
		case <-ctx.Done():
			t.Fatal("a lookup in Postgres did not end")
		}
	}
}

// TestLogin_MadeUpTokenFloodLeavesRoomForOthers: a login looks its operator token up in
// Postgres, on the pool the API shares, before anything says who the client is. A client without
// any credential, sending logins with made-up (well-formed) operator tokens while Postgres was
// slow (here: behind a lock of the operators table), held as many pool connections as it had
// logins in flight. Now they hold at most a quarter of the pool (one of four); the excess waits
// for a place up to LookupWait, then is answered 503 overloaded with Retry-After; once Postgres
// answers, the one under way is refused as ever (401 invalid_token) and a real login succeeds.
func TestLogin_MadeUpTokenFloodLeavesRoomForOthers(t *testing.T) {
	t.Parallel()
	b, pool := setupFourConns(t, 200*time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	conn, err := pgx.Connect(ctx, b.jobs.URL)
	require.NoError(t, err)
	defer conn.Close(context.Background())
	var wg sync.WaitGroup
	defer wg.Wait() // after the rollback, which ends the lookups still waiting
	tx, err := conn.Begin(ctx)
	require.NoError(t, err)
	rollback := sync.OnceFunc(func() { require.NoError(t, tx.Rollback(ctx)) })
	defer rollback()
	_, err = tx.Exec(ctx, `LOCK TABLE operators IN ACCESS EXCLUSIVE MODE`)
	require.NoError(t, err)
	watch, err := pgx.Connect(ctx, b.jobs.URL)
	require.NoError(t, err)
	defer watch.Close(context.Background())

	const flood = 4 // the pool's size
	answers := make(chan cookieAnswer, flood)
	for range flood {
		token, err := secrettoken.New(nil, operator.TokenPrefix)
		require.NoError(t, err)
		wg.Go(func() { answers <- loginWith(ctx, b.srv.URL, token) })
	}
	answered := pgtest.LockWaitingOrAnswered(ctx, t, watch, answers, flood, "the flood's logins")

	// The pool has room for its other users while the flood holds on.
	acquireCtx, cancelAcquire := context.WithTimeout(ctx, 30*time.Second)
	defer cancelAcquire()
	c, err := pool.Acquire(acquireCtx)
	require.NoError(t, err, "a connection of the pool while made-up logins flood the console")
	c.Release()

	require.Len(t, answered, flood-1, "a quarter of the pool (one connection) looks logins up")
	for _, a := range answered {
		require.Equal(t, http.StatusServiceUnavailable, a.status, a.body)
		require.Contains(t, a.body, `"overloaded"`)
		require.Equal(t, "1", a.retryAfter)
	}

	rollback()
	select {
	case a := <-answers:
		require.Equal(t, http.StatusUnauthorized, a.status, a.body)
		require.Contains(t, a.body, `"invalid_token"`)
	case <-ctx.Done():
		t.Fatal("the login in Postgres did not end")
	}
	real := loginWith(ctx, b.srv.URL, b.token)
	require.Equal(t, http.StatusOK, real.status, real.body)
	require.Contains(t, real.body, `"operator":"alice"`)
}

// loginWith logs in with the operator token within 20 s. It is safe to call from any goroutine.
func loginWith(ctx context.Context, base, token string) cookieAnswer {
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/console/api/login",
		strings.NewReader(fmt.Sprintf(`{"token":%q}`, token)))
	if err != nil {
		return cookieAnswer{body: err.Error()}
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return cookieAnswer{body: err.Error()}
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		return cookieAnswer{body: fmt.Sprint(err)}
	}
	return cookieAnswer{status: resp.StatusCode, retryAfter: resp.Header.Get("Retry-After"), body: string(raw)}
}

// cookieAnswer is an answer's status, Retry-After and body (or what went wrong, as its body).
type cookieAnswer struct {
	status           int
	retryAfter, body string
}

// sessionWith asks for the session of the cookie within 20 s. It is safe to call from any
// goroutine.
func sessionWith(ctx context.Context, base, cookie string) cookieAnswer {
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/console/api/session", nil)
	if err != nil {
		return cookieAnswer{body: err.Error()}
	}
	req.AddCookie(&http.Cookie{Name: "llmq_console", Value: cookie})
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return cookieAnswer{body: err.Error()}
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		return cookieAnswer{body: fmt.Sprint(err)}
	}
	return cookieAnswer{status: resp.StatusCode, retryAfter: resp.Header.Get("Retry-After"), body: string(raw)}
}

// setupFourConns is setupConfig with a pool of four connections of its own (closed at the
// test's end), so that the credential lookups take one place (a quarter), and LookupWait
// lookupWait (the default when 0).
func setupFourConns(t *testing.T, lookupWait time.Duration) (*testBundle, *pgxpool.Pool) {
	t.Helper()
	var pool *pgxpool.Pool
	b := setupConfig(t, func(cfg *console.Config) {
		var err error
		pool, err = pgxpool.New(context.Background(), cfg.Pool.Config().ConnString()+"&pool_max_conns=4")
		require.NoError(t, err)
		t.Cleanup(pool.Close)
		cfg.Pool, cfg.LookupWait = pool, lookupWait
	})
	return b, pool
}
