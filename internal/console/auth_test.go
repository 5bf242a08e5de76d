package console_test

import (
	"context"
	"crypto/tls"
	"log/slog"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/clocktest"
	"github.com/llmq/llmq/internal/console"
	"github.com/llmq/llmq/internal/logtest"
	"github.com/llmq/llmq/internal/openapitest"
	"github.com/llmq/llmq/internal/operator"
	"github.com/llmq/llmq/internal/tenant"
)

func sessionCookie(t *testing.T, res *http.Response) *http.Cookie {
	t.Helper()
	for _, c := range res.Cookies() {
		if c.Name == "llmq_console" {
			return c
		}
	}
	t.Fatalf("no session cookie in %v", res.Header["Set-Cookie"])
	return nil
}

func TestLogin_CookieFlags(t *testing.T) {
	t.Parallel()
	b := setup(t)

	t.Run("PlainHTTP", func(t *testing.T) {
		t.Parallel()
		c := b.anonymous(t)
		res, body := c.do(http.MethodPost, "/console/api/login", map[string]string{"token": b.token}, nil)
		require.Equal(t, http.StatusOK, res.StatusCode, body)
		ck := sessionCookie(t, res)
		require.True(t, ck.HttpOnly)
		require.Equal(t, http.SameSiteStrictMode, ck.SameSite)
		require.Equal(t, "/console/", ck.Path)
		require.False(t, ck.Secure, "not Secure without TLS: the browser would drop it")
		require.NotContains(t, body, ck.Value, "the session token is in the cookie only")
	})
	t.Run("SecureBehindATLSProxy", func(t *testing.T) {
		t.Parallel()
		c := b.anonymous(t)
		res, body := c.do(http.MethodPost, "/console/api/login", map[string]string{"token": b.token},
			http.Header{"X-Forwarded-Proto": {"https"}})
		require.Equal(t, http.StatusOK, res.StatusCode, body)
		require.True(t, sessionCookie(t, res).Secure)
	})
	t.Run("SecureOverTLS", func(t *testing.T) {
		t.Parallel()
		h, err := console.New(console.Config{Pool: b.jobs.Pool, Jobs: b.jobs.Store, Redis: b.rdb, RedisPrefix: b.prefix})
		require.NoError(t, err)
		srv := httptest.NewTLSServer(openapitest.Handler(t, h))
		defer srv.Close()
		jar, _ := cookiejar.New(nil)
		c := &client{t: t, base: srv.URL, http: &http.Client{Jar: jar, Transport: &http.Transport{
			TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}} //nolint:gosec // the test server's own certificate
		res, body := c.do(http.MethodPost, "/console/api/login", map[string]string{"token": b.token}, nil)
		require.Equal(t, http.StatusOK, res.StatusCode, body)
		ck := sessionCookie(t, res)
		require.True(t, ck.Secure)
		require.True(t, ck.HttpOnly)
		require.Equal(t, http.SameSiteStrictMode, ck.SameSite)
	})
}

func TestLogin_Refusals(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	_, tenantToken, err := tenant.NewStore(b.jobs.Pool, nil).Create(ctx, "acme", nil)
	require.NoError(t, err)

	t.Run("TenantToken", func(t *testing.T) {
		t.Parallel()
		c := b.anonymous(t)
		res, body := c.do(http.MethodPost, "/console/api/login", map[string]string{"token": tenantToken}, nil)
		requireError(t, res, body, http.StatusUnauthorized, "tenant_token")
		require.Empty(t, res.Cookies())
		// Nor does a bearer token open any page of the console.
		res, body = c.do(http.MethodGet, "/console/api/overview", nil, http.Header{"Authorization": {"Bearer " + tenantToken}})
		requireError(t, res, body, http.StatusUnauthorized, "unauthorized")
		require.Contains(t, body, "does not take bearer tokens")
		res, body = c.do(http.MethodGet, "/console/api/overview", nil, http.Header{"Authorization": {"Bearer " + b.token}})
		requireError(t, res, body, http.StatusUnauthorized, "unauthorized")
	})
	t.Run("UnknownAndMalformed", func(t *testing.T) {
		t.Parallel()
		c := b.anonymous(t)
		for _, tok := range []string{"", "nonsense", operator.TokenPrefix + strings.Repeat("A", 43)} {
			res, body := c.do(http.MethodPost, "/console/api/login", map[string]string{"token": tok}, nil)
			requireError(t, res, body, http.StatusUnauthorized, "invalid_token")
		}
		res, body := c.do(http.MethodPost, "/console/api/login", nil, nil)
		requireError(t, res, body, http.StatusBadRequest, "invalid_body")
	})
	t.Run("Revoked", func(t *testing.T) {
		t.Parallel()
		store := operator.NewStore(b.jobs.Pool, nil)
		_, tok, err := store.Create(ctx, "bob")
		require.NoError(t, err)
		c := b.anonymous(t)
		res, body := c.do(http.MethodPost, "/console/api/login", map[string]string{"token": tok}, nil)
		require.Equal(t, http.StatusOK, res.StatusCode, body)
		_, err = store.Revoke(ctx, "bob")
		require.NoError(t, err)
		// The open session ends with the revocation; the token no longer logs in.
		res, body = c.do(http.MethodGet, "/console/api/session", nil, nil)
		requireError(t, res, body, http.StatusUnauthorized, "session_expired")
		res, body = c.do(http.MethodPost, "/console/api/login", map[string]string{"token": tok}, nil)
		requireError(t, res, body, http.StatusForbidden, "operator_revoked")
	})
	t.Run("NoSession", func(t *testing.T) {
		t.Parallel()
		c := b.anonymous(t)
		for _, p := range []string{"/console/api/overview", "/console/api/jobs", "/console/api/dead", "/console/api/session"} {
			res, body := c.do(http.MethodGet, p, nil, nil)
			requireError(t, res, body, http.StatusUnauthorized, "unauthorized")
		}
	})
}

func TestCSRF_EveryActionNeedsTheToken(t *testing.T) {
	t.Parallel()
	b := setup(t, console.Credential{Name: "default", Provider: "anthropic"})
	c := b.login(t)
	dead := b.jobs.Dead(t, jobstestOpts(), "retries_exhausted", 1)
	queued := b.jobs.Create(t, jobstestOpts())
	actions := []struct {
		path string
		body any
	}{
		{"/console/api/dead/retry", map[string]any{"ids": []string{dead.ID}}},
		{"/console/api/dead/purge", map[string]any{"ids": []string{dead.ID}}},
		{"/console/api/credentials/default/resume", nil},
		{"/console/api/tenants", map[string]any{"name": "evil"}},
		{"/console/api/tenants/x/revoke", nil},
		{"/console/api/tenants/x/rotate", map[string]any{"overlap_seconds": 0}},
		{"/console/api/tenants/x/weight", map[string]any{"weight": 2}},
		{"/console/api/jobs/" + queued.ID + "/cancel", nil},
		{"/console/api/logout", nil},
	}
	for _, a := range actions {
		for name, h := range map[string]http.Header{
			"missing":     {"X-Csrf-Token": {""}},
			"wrong":       {"X-Csrf-Token": {c.csrf + "x"}},
			"crossOrigin": {"Origin": {"https://evil.example"}},
		} {
			res, body := c.do(http.MethodPost, a.path, a.body, h)
			typ := "csrf"
			if name == "crossOrigin" {
				typ = "cross_origin"
			}
			requireError(t, res, body, http.StatusForbidden, typ)
		}
	}
	// Nothing happened: the job is still dead, no tenant was made, the session is alive, and
	// the audit log has only the login.
	job, err := b.jobs.Store.Get(context.Background(), dead.ID)
	require.NoError(t, err)
	require.Equal(t, "dead", string(job.Status))
	job, err = b.jobs.Store.Get(context.Background(), queued.ID)
	require.NoError(t, err)
	require.Equal(t, "queued", string(job.Status))
	res, body := c.do(http.MethodGet, "/console/api/session", nil, nil)
	require.Equal(t, http.StatusOK, res.StatusCode, body)
	entries := b.audit(t)
	require.Len(t, entries, 1)
	require.Equal(t, "login", entries[0].Action)
}

func TestLogout_EndsTheSession(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := b.login(t)
	res, body := c.do(http.MethodPost, "/console/api/logout", nil, nil)
	require.Equal(t, http.StatusOK, res.StatusCode, body)
	require.Equal(t, -1, sessionCookie(t, res).MaxAge)
	res, body = c.do(http.MethodGet, "/console/api/session", nil, nil)
	requireError(t, res, body, http.StatusUnauthorized, "unauthorized")
	actions := []string{}
	for _, e := range b.audit(t) {
		actions = append(actions, e.Action)
		require.Equal(t, "alice", e.Operator)
	}
	require.Equal(t, []string{"logout", "login"}, actions)
}

func TestPage_ServedEmbeddedWithHeaders(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := b.anonymous(t)
	res, body := c.do(http.MethodGet, "/console/", nil, nil)
	require.Equal(t, http.StatusOK, res.StatusCode)
	require.Contains(t, body, `<script src="/console/static/app.js"`)
	require.Contains(t, res.Header.Get("Content-Security-Policy"), "default-src 'self'")
	require.Equal(t, "DENY", res.Header.Get("X-Frame-Options"))
	for _, p := range []string{"/console/static/app.js", "/console/static/app.css"} {
		res, body := c.do(http.MethodGet, p, nil, nil)
		require.Equal(t, http.StatusOK, res.StatusCode, p)
		require.NotContains(t, body, "http://", "no asset is fetched from elsewhere")
		require.NotContains(t, body, "https://", "no asset is fetched from elsewhere")
	}
	res, body = c.do(http.MethodGet, "/console/nope", nil, nil)
	requireError(t, res, body, http.StatusNotFound, "not_found")
}

// TestLogin_RevokedOperatorIsLogged: a revoked operator's refused login is an operator security
// event (a token that should be out of use is in use): it is logged, naming the operator and why,
// never the token. It was answered 403 and logged nothing.
func TestLogin_RevokedOperatorIsLogged(t *testing.T) {
	t.Parallel()
	var logs logtest.Buffer
	b := setupConfig(t, func(cfg *console.Config) { cfg.Logger = slog.New(slog.NewTextHandler(&logs, nil)) })
	ctx := context.Background()
	store := operator.NewStore(b.jobs.Pool, nil)
	_, tok, err := store.Create(ctx, "bob")
	require.NoError(t, err)
	_, err = store.Revoke(ctx, "bob")
	require.NoError(t, err)

	res, body := b.anonymous(t).do(http.MethodPost, "/console/api/login", map[string]string{"token": tok}, nil)
	requireError(t, res, body, http.StatusForbidden, "operator_revoked")
	require.Equal(t, 1, logs.Count("console: login refused"), logs.String())
	require.Contains(t, logs.String(), "level=WARN")
	require.Contains(t, logs.String(), "operator=bob")
	require.Contains(t, logs.String(), `reason="operator revoked"`)
	require.NotContains(t, logs.String(), tok, "the token is a secret")
	require.NotContains(t, logs.String(), tok[len(operator.TokenPrefix):])

	// An unknown token names nobody: it is not this event (the lookup gate answers floods).
	res, body = b.anonymous(t).do(http.MethodPost, "/console/api/login", map[string]string{"token": operator.TokenPrefix + strings.Repeat("A", 43)}, nil)
	requireError(t, res, body, http.StatusUnauthorized, "invalid_token")
	require.Equal(t, 1, logs.Count("console: login refused"), logs.String())
}

// TestLogin_RevokedOperatorRefusalsAreThrottled: a script retrying a revoked operator's token
// wrote a "console: login refused" line a try, bounded only by the console's lookup cap. Now an
// operator's first refusal is logged at once and those within console.LoginLogInterval after it
// are counted, then reported in one line with their count once it has passed (the last of them
// named: its remote_addr); another operator's refusal is logged at once. After Shutdown, nothing
// held back is reported.
func TestLogin_RevokedOperatorRefusalsAreThrottled(t *testing.T) {
	t.Parallel()
	var logs logtest.Buffer
	clock := clocktest.New(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	b := setupConfig(t, func(cfg *console.Config) {
		cfg.Logger, cfg.Now = slog.New(slog.NewTextHandler(&logs, nil)), clock.Now
	})
	var mu sync.Mutex
	var reports []func()
	console.SetLoginLogAfterFunc(b.h, func(_ time.Duration, f func()) func() bool {
		mu.Lock()
		defer mu.Unlock()
		reports = append(reports, f)
		return func() bool { return true }
	})
	fire := func() (fired int) {
		mu.Lock()
		due := reports
		reports = nil
		mu.Unlock()
		for _, f := range due {
			f()
		}
		return len(due)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	store := operator.NewStore(b.jobs.Pool, nil)
	tokens := map[string]string{}
	for _, name := range []string{"bob", "carol"} {
		_, tok, err := store.Create(ctx, name)
		require.NoError(t, err)
		_, err = store.Revoke(ctx, name)
		require.NoError(t, err)
		tokens[name] = tok
	}
	refused := func(name string) {
		t.Helper()
		res, body := b.anonymous(t).do(http.MethodPost, "/console/api/login",
			map[string]string{"token": tokens[name]}, nil)
		requireError(t, res, body, http.StatusForbidden, "operator_revoked")
	}
	const line = `level=WARN msg="console: login refused" operator=`

	for range 5 {
		refused("bob")
	}
	require.Equal(t, 1, logs.Count(line+"bob"), "the first of an operator's refusals: %s",
		logs.String())
	refused("carol")
	require.Equal(t, 1, logs.Count(line+"carol"), "another operator's is logged at once: %s",
		logs.String())

	clock.Advance(console.LoginLogInterval)
	require.Equal(t, 1, fire(), "one report, of bob's held back")
	require.Equal(t, 2, logs.Count(line+"bob"), logs.String())
	require.Regexp(t, line+`bob reason="operator revoked" remote_addr=\S+ suppressed=4\n`,
		logs.String(), "the report counts the four held back")
	require.Equal(t, 1, logs.Count(line+"carol"), logs.String())

	// The report counts as a line: a refusal within the interval after it is held back, and
	// never reported once the console has shut down.
	refused("bob")
	b.h.Shutdown()
	clock.Advance(console.LoginLogInterval)
	fire()
	require.Equal(t, 2, logs.Count(line+"bob"), logs.String())
}

// TestLogin_AnotherLoginKeepsTheFirstSession: logging in again (another browser, a teammate
// sharing the operator) opens a session of its own and ends none (see the decision "Logging in
// again ends no other session"); logout ends only its own.
func TestLogin_AnotherLoginKeepsTheFirstSession(t *testing.T) {
	t.Parallel()
	b := setup(t)
	first, second := b.login(t), b.login(t)
	for _, c := range []*client{first, second} {
		res, body := c.do(http.MethodGet, "/console/api/session", nil, nil)
		require.Equal(t, http.StatusOK, res.StatusCode, body)
	}
	res, body := second.do(http.MethodPost, "/console/api/logout", nil, nil)
	require.Equal(t, http.StatusOK, res.StatusCode, body)
	res, body = first.do(http.MethodGet, "/console/api/session", nil, nil)
	require.Equal(t, http.StatusOK, res.StatusCode, body)
}
