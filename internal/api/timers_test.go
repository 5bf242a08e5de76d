package api

import (
	"context"
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
// Authenticator's TTL: none. A bound on the lookup (StoreTimeout: storeTimed) was made at every
// submit, its context, its timer, its cancel and the request's copy (5 allocations), for an
// answer that waits for nothing; it is made only when the answer is looked up in Postgres. The
// token's copy for its hash (secrettoken.Hash) was one more.
func TestServer_SubmitTenantAllocs(t *testing.T) { // not parallel: testing.AllocsPerRun
	store := tenant.NewStore(pgtest.Pool(t), nil)
	_, token, err := store.Create(t.Context(), "acme", nil)
	require.NoError(t, err)
	now := time.Now() // the Authenticator's clock stands still: its answers stay fresh
	s := New(Config{AllowAnonymous: true,
		Tenants: tenant.NewAuthenticator(store, &tenant.AuthenticatorConfig{Now: func() time.Time { return now }})})
	t.Cleanup(s.Shutdown)
	for _, c := range []struct{ name, authorization, tenant string }{
		{"Token", "Bearer " + token, "acme"},
		{"Anonymous", "", tenant.Default},
	} {
		r := httptest.NewRequestWithContext(context.Background(), http.MethodPost, "/v1/jobs", nil)
		if c.authorization != "" {
			r.Header.Set("Authorization", c.authorization)
		}
		w := httptest.NewRecorder()
		tn, _, ok := s.submitTenant(w, r) // looked up, and cached
		require.True(t, ok, "%s: %s", c.name, w.Body)
		require.Equal(t, c.tenant, tn.Name)
		allocs := testing.AllocsPerRun(200, func() {
			if _, _, ok := s.submitTenant(w, r); !ok {
				panic(w.Body.String())
			}
		})
		t.Logf("%s: %.1f allocations", c.name, allocs)
		require.Zero(t, allocs, "%s: allocations per submit's authentication from the cache", c.name)
	}
}

// BenchmarkServer_Submit is a submit without an Idempotency-Key by a tenant whose token is
// cached, answered 202, its job committed (not enqueued): run with -benchmem for the allocations
// per submit of the API's side (the request and its recorder included).
func BenchmarkServer_Submit(b *testing.B) {
	pcfg, err := pgxpool.ParseConfig(pgtest.URL(b))
	require.NoError(b, err)
	pcfg.ConnConfig.Tracer = pgwait.Tracer{} // as migrations.Open does
	pool, err := pgxpool.NewWithConfig(context.Background(), pcfg)
	require.NoError(b, err)
	b.Cleanup(pool.Close)
	store := tenant.NewStore(pool, nil)
	_, token, err := store.Create(context.Background(), "acme", nil)
	require.NoError(b, err)
	now := time.Now() // the Authenticator's clock stands still: its answer stays fresh
	s := New(Config{Store: jobs.NewStore(pool, nil), Pool: pool, Submit: SubmitConfig{Credentials: []string{"default"}},
		Tenants: tenant.NewAuthenticator(store, &tenant.AuthenticatorConfig{Now: func() time.Time { return now }})})
	b.Cleanup(s.Shutdown)
	b.ReportAllocs()
	for b.Loop() {
		r := httptest.NewRequest(http.MethodPost, "/v1/jobs", strings.NewReader(minimalSubmit))
		r.Header.Set("Authorization", "Bearer "+token)
		w := httptest.NewRecorder()
		s.ServeHTTP(w, r)
		if w.Code != http.StatusAccepted {
			b.Fatalf("submit: %d %s", w.Code, w.Body)
		}
	}
}
