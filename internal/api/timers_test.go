package api

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/jobs"
	"github.com/llmq/llmq/internal/pgtest"
	"github.com/llmq/llmq/internal/pgwait"
	"github.com/llmq/llmq/internal/tenant"
)

// TestServer_SubmitTenantAllocs pins the allocations of a submit's authentication when the
// caller's answer is cached, as it is for all but a token's first request in the
// Authenticator's TTL: none. A bound on the lookup (StoreTimeout) was made at every
// submit, its context, its timer, its cancel and the request's copy (5 allocations), for an
// answer that waits for nothing; it is made only when the answer is looked up in Postgres. The
// token's copy for its hash (secrettoken.Hash) was one more.
func TestServer_SubmitTenantAllocs(t *testing.T) { // not parallel: testing.AllocsPerRun
	requireCachedAuthFree(t, http.MethodPost, "/v1/jobs", func(s *Server, r *http.Request) (*tenant.Tenant, bool) {
		tn, _, ok := s.authenticated(r, func(_ *http.Request, err error) { panic(err) })
		return tn, ok
	})
}

// TestServer_StreamCallerAllocs pins the allocations of an event stream's authentication when
// the caller's answer is cached, as at a reconnect within the Authenticator's TTL: none. The
// stream's bounds (storeBounded: StoreWait's and StoreTimeout's contexts, the timer, the
// request's copy and the cancels) were made at every opening, 15 allocations with the query's
// parse, for an answer that waits for nothing; they are made only for a lookup in Postgres.
func TestServer_StreamCallerAllocs(t *testing.T) { // not parallel: testing.AllocsPerRun
	w := httptest.NewRecorder()
	requireCachedAuthFree(t, http.MethodGet, "/v1/jobs/x/events", func(s *Server, r *http.Request) (*tenant.Tenant, bool) {
		tn, ok := s.streamCaller(w, r, nil)
		if !ok {
			panic(w.Body.String())
		}
		return tn, ok
	})
}

// TestServer_StreamRefusalAllocs pins the allocations of an open event stream's check of its
// token (streamRefusal: a bearer token's, the anonymous tenant's, a signed URL's tenant's) when
// the answer is cached, as at the check that starts every stream, just authenticated: none. Its
// bounds (storeBounded) were made before the cache was looked at, 14 allocations a check for an
// answer that waits for nothing; they are made only for a lookup in Postgres.
func TestServer_StreamRefusalAllocs(t *testing.T) { // not parallel: testing.AllocsPerRun
	s, token := newCachedAuthServer(t)
	for _, c := range []struct {
		name, authorization string
		signed              bool
	}{
		{"Token", "Bearer " + token, false},
		{"Anonymous", "", false},
		{"SignedURL", "", true},
	} {
		r := httptest.NewRequestWithContext(context.Background(), http.MethodGet, "/v1/jobs/x/events", nil)
		if c.authorization != "" {
			r.Header.Set("Authorization", c.authorization)
		}
		job := &jobs.Job{ID: "x", Tenant: "acme"}
		require.Nil(t, s.streamRefusal(r, job, c.signed), c.name) // looked up, and cached
		allocs := testing.AllocsPerRun(200, func() {
			if refusal := s.streamRefusal(r, job, c.signed); refusal != nil {
				panic(refusal.message)
			}
		})
		t.Logf("%s: %.1f allocations", c.name, allocs)
		require.Zero(t, allocs, "%s: allocations per check from the cache", c.name)
	}
}

// newCachedAuthServer returns a server taking anonymous requests, whose tenants' cache has a clock
// that stands still (its answers stay fresh), and the token of its tenant "acme".
func newCachedAuthServer(t *testing.T) (*Server, string) {
	t.Helper()
	store := tenant.NewStore(pgtest.Pool(t), nil)
	_, token, err := store.Create(t.Context(), "acme", nil)
	require.NoError(t, err)
	now := time.Now()
	s := New(Config{AllowAnonymous: true,
		Tenants: tenant.NewAuthenticator(store, &tenant.AuthenticatorConfig{Now: func() time.Time { return now }})})
	t.Cleanup(s.Shutdown)
	return s, token
}

// requireCachedAuthFree requires authenticate, given a method and target's request of tenant
// "acme"'s token or of the anonymous tenant, to answer that tenant, and without an allocation
// once the answer is cached (the Authenticator's clock stands still: its answers stay fresh).
func requireCachedAuthFree(t *testing.T, method, target string, authenticate func(*Server, *http.Request) (*tenant.Tenant, bool)) {
	t.Helper()
	s, token := newCachedAuthServer(t)
	for _, c := range []struct{ name, authorization, tenant string }{
		{"Token", "Bearer " + token, "acme"},
		{"Anonymous", "", tenant.Default},
	} {
		r := httptest.NewRequestWithContext(context.Background(), method, target, nil)
		if c.authorization != "" {
			r.Header.Set("Authorization", c.authorization)
		}
		tn, ok := authenticate(s, r) // looked up, and cached
		require.True(t, ok, c.name)
		require.Equal(t, c.tenant, tn.Name)
		allocs := testing.AllocsPerRun(200, func() { authenticate(s, r) })
		t.Logf("%s: %.1f allocations", c.name, allocs)
		require.Zero(t, allocs, "%s: allocations per authentication from the cache", c.name)
	}
}

// BenchmarkServer_Submit is a submit without an Idempotency-Key by a tenant whose token is
// cached, answered 202, its job committed (not enqueued): run with -benchmem for the allocations
// per submit of the API's side (the request and its recorder included).
func BenchmarkServer_Submit(b *testing.B) {
	s, token := newBenchServer(b)
	b.ReportAllocs()
	for b.Loop() {
		benchServe(b, s, token, http.MethodPost, "/v1/jobs", strings.NewReader(minimalSubmit), http.StatusAccepted)
	}
}

// BenchmarkServer_GetJob is a poll (GET /v1/jobs/{id}) by a tenant whose token is cached,
// answered 200 with its job: run with -benchmem for the allocations per poll of the API's side
// (the request and its recorder included).
func BenchmarkServer_GetJob(b *testing.B) {
	s, token := newBenchServer(b)
	w := benchServe(b, s, token, http.MethodPost, "/v1/jobs", strings.NewReader(minimalSubmit), http.StatusAccepted)
	var job struct{ ID string }
	require.NoError(b, json.Unmarshal(w.Body.Bytes(), &job))
	b.ReportAllocs()
	for b.Loop() {
		benchServe(b, s, token, http.MethodGet, "/v1/jobs/"+job.ID, nil, http.StatusOK)
	}
}

// newBenchServer returns a Server on its own database, its pool traced as migrations.Open's is,
// and the token of its tenant "acme", whose answer the Authenticator keeps fresh (its clock
// stands still).
func newBenchServer(b *testing.B) (_ *Server, token string) {
	pcfg, err := pgxpool.ParseConfig(pgtest.URL(b))
	require.NoError(b, err)
	pcfg.ConnConfig.Tracer = pgwait.Tracer{}
	pool, err := pgxpool.NewWithConfig(context.Background(), pcfg)
	require.NoError(b, err)
	b.Cleanup(pool.Close)
	store := tenant.NewStore(pool, nil)
	_, token, err = store.Create(context.Background(), "acme", nil)
	require.NoError(b, err)
	now := time.Now()
	s := New(Config{Store: jobs.NewStore(pool, nil), Pool: pool, Submit: SubmitConfig{Credentials: []string{"default"}},
		Tenants: tenant.NewAuthenticator(store, &tenant.AuthenticatorConfig{Now: func() time.Time { return now }})})
	b.Cleanup(s.Shutdown)
	return s, token
}

// benchServe serves s a request of token's tenant and requires its answer's status to be want.
func benchServe(b *testing.B, s *Server, token, method, target string, body io.Reader, want int) *httptest.ResponseRecorder {
	r := httptest.NewRequest(method, target, body)
	r.Header.Set("Authorization", "Bearer "+token)
	w := httptest.NewRecorder()
	s.ServeHTTP(w, r)
	if w.Code != want {
		b.Fatalf("%s %s: %d %s", method, target, w.Code, w.Body)
	}
	return w
}

// TestServer_SubmitRefusedAllocs pins the allocations of a submit refused before its work in
// Postgres (413: its Content-Length over MaxBodyBytes), by a tenant whose token is cached, the
// request and its recorder excluded: 20, its answer's. Every submit was given a pgwait bound and
// a copy of its request before it was read (6 allocations, 26 in all), which a refused one never
// used; the submit makes its bounds where its store work is (storeBounded), with one copy of the
// request.
func TestServer_SubmitRefusedAllocs(t *testing.T) { // not parallel: testing.AllocsPerRun
	if raceEnabled {
		t.Skip("the race detector's sync.Pool drops pooled buffers at random")
	}
	store := tenant.NewStore(pgtest.Pool(t), nil)
	_, token, err := store.Create(t.Context(), "acme", nil)
	require.NoError(t, err)
	now := time.Now()
	s := New(Config{MaxBodyBytes: 10,
		Tenants: tenant.NewAuthenticator(store, &tenant.AuthenticatorConfig{Now: func() time.Time { return now }})})
	t.Cleanup(s.Shutdown)
	r := httptest.NewRequestWithContext(context.Background(), http.MethodPost, "/v1/jobs", strings.NewReader(minimalSubmit))
	r.Header.Set("Authorization", "Bearer "+token)
	w := httptest.NewRecorder()
	s.ServeHTTP(w, r) // the token looked up, and cached
	require.Equal(t, http.StatusRequestEntityTooLarge, w.Code, w.Body.String())
	allocs := testing.AllocsPerRun(200, func() {
		w.Body.Reset()
		clear(w.Header())
		s.ServeHTTP(w, r)
	})
	t.Logf("%.1f allocations", allocs)
	require.LessOrEqual(t, allocs, 20.0, "allocations per refused submit")
}
