package e2e_test

import (
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/tenant"
)

// tenantHeader creates a tenant on the test's database (as `ctl tenants create` does) and returns
// the header that authenticates as it.
func (b *testBundle) tenantHeader(t *testing.T, name string, credentials ...string) map[string]string {
	t.Helper()
	pool, err := openPool(b.ctx, b.dbURL)
	require.NoError(t, err)
	defer pool.Close()
	_, token, err := tenant.NewStore(pool, nil).Create(b.ctx, name, credentials)
	require.NoError(t, err)
	return map[string]string{"Authorization": "Bearer " + token}
}

// TestTenants_Isolation runs real jobs of two tenants (and anonymous ones) through the API and a
// worker: each sees only its own, on GET, events and DELETE alike, and a limited tenant cannot
// reach other credentials.
func TestTenants_Isolation(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	acme, globex := b.tenantHeader(t, "acme"), b.tenantHeader(t, "globex", "default", "backup")

	submit := func(h map[string]string, body string) string {
		r := b.do(t, http.MethodPost, "/v1/jobs", body, h)
		require.Equal(t, http.StatusAccepted, r.status, "body %v", r.body)
		return r.body["id"].(string)
	}
	acmeJob := submit(acme, anthropicBody("acme's secret plan"))
	globexJob := submit(globex, anthropicBody("globex's plan"))
	anonJob := submit(nil, anthropicBody("anonymous"))

	owners := map[string]map[string]string{acmeJob: acme, globexJob: globex, anonJob: nil}
	for id, owner := range owners {
		// The owner sees it through (polling with its own token).
		require.Eventually(t, func() bool {
			r := b.do(t, http.MethodGet, "/v1/jobs/"+id, "", owner)
			return r.status == http.StatusOK && r.body["status"] == "succeeded"
		}, 30*time.Second, 20*time.Millisecond)
		for other, h := range map[string]map[string]string{"acme": acme, "globex": globex, "anonymous": nil} {
			if id == anonJob && other == "anonymous" || id == acmeJob && other == "acme" || id == globexJob && other == "globex" {
				continue
			}
			for _, m := range []struct{ method, path string }{
				{http.MethodGet, "/v1/jobs/" + id}, {http.MethodGet, "/v1/jobs/" + id + "/events"}, {http.MethodDelete, "/v1/jobs/" + id},
			} {
				r := b.do(t, m.method, m.path, "", h)
				require.Equal(t, http.StatusNotFound, r.status, "%s %s as %s: %v", m.method, m.path, other, r.body)
				require.Equal(t, "not_found", r.body["error"].(map[string]any)["type"])
			}
		}
	}

	// The same Idempotency-Key in two tenants makes two jobs.
	key := func(h map[string]string) map[string]string {
		return map[string]string{"Authorization": h["Authorization"], "Idempotency-Key": "shared-key"}
	}
	a := b.do(t, http.MethodPost, "/v1/jobs", anthropicBody("k"), key(acme))
	g := b.do(t, http.MethodPost, "/v1/jobs", anthropicBody("k"), key(globex))
	require.Equal(t, http.StatusAccepted, a.status)
	require.Equal(t, http.StatusAccepted, g.status)
	require.NotEqual(t, a.body["id"], g.body["id"])

	// globex may use default and backup, not oai, neither as primary nor as fallback.
	r := b.do(t, http.MethodPost, "/v1/jobs", `{"credential":"oai","request":{"model":"gpt","messages":[]}}`, globex)
	require.Equal(t, http.StatusForbidden, r.status)
	require.Equal(t, "credential_not_allowed", r.body["error"].(map[string]any)["type"])
	require.Contains(t, r.body["error"].(map[string]any)["message"], `"oai"`)
	require.Equal(t, http.StatusAccepted, b.do(t, http.MethodPost, "/v1/jobs",
		`{"credential":"default","fallbacks":["backup"],"request":{"model":"m","max_tokens":5,"messages":[]}}`, globex).status)

	var perTenant int
	b.queryRow(t, `SELECT count(*) FROM jobs WHERE tenant = 'globex'`, nil, &perTenant)
	require.Equal(t, 3, perTenant)
}

// TestTenants_RevocationTakesEffectWithinSeconds revokes a tenant that has just used its token
// (so the API has it cached): within the cache TTL its requests answer 403. What is checked is
// that every request sent once the TTL has passed since the revocation answers 403, not how
// soon after the revocation an answer comes: on a loaded machine a submit answered from the
// cache may itself take longer than the TTL.
func TestTenants_RevocationTakesEffectWithinSeconds(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{noWorker: true})
	acme := b.tenantHeader(t, "acme")
	id := b.submit(t, anthropicBody("before")) // anonymous
	require.Equal(t, http.StatusAccepted, b.do(t, http.MethodPost, "/v1/jobs", anthropicBody("mine"), acme).status)

	pool, err := openPool(b.ctx, b.dbURL)
	require.NoError(t, err)
	defer pool.Close()
	revokedAt := time.Now()
	_, err = tenant.NewStore(pool, nil).Revoke(b.ctx, "acme")
	require.NoError(t, err)

	for {
		sent := time.Now()
		status := b.do(t, http.MethodPost, "/v1/jobs", anthropicBody("after"), acme).status
		if status == http.StatusForbidden {
			break
		}
		// The token's answer was cached before the revocation, so it is stale by then; a
		// request sent later waits at most requestTimeout, so this loop ends.
		require.Less(t, sent.Sub(revokedAt), tenant.DefaultCacheTTL,
			"a request sent %s after the revocation answered %d: the API caches tokens for %s",
			sent.Sub(revokedAt), status, tenant.DefaultCacheTTL)
		time.Sleep(50 * time.Millisecond) // polling, bounded by the TTL above
	}
	r := b.do(t, http.MethodGet, "/v1/jobs/"+id, "", acme)
	require.Equal(t, http.StatusForbidden, r.status)
	require.Equal(t, "token_revoked", r.body["error"].(map[string]any)["type"])
	require.Equal(t, http.StatusUnauthorized, b.do(t, http.MethodGet, "/v1/jobs/"+id, "", map[string]string{"Authorization": "Bearer llmq_nope"}).status)
}
