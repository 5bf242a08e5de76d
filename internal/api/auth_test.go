package api

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/jobs"
	"github.com/llmq/llmq/internal/redistest"
	"github.com/llmq/llmq/internal/tenant"
)

const minimalSubmit = `{"request":{"model":"m"}}`

// newTenant creates a tenant (limited to credentials, when given) and returns the header that
// authenticates as it.
func (b *testBundle) newTenant(t *testing.T, name string, credentials ...string) map[string]string {
	t.Helper()
	_, token, err := b.tenants.Create(context.Background(), name, credentials)
	require.NoError(t, err)
	return map[string]string{"Authorization": "Bearer " + token}
}

func requireError(t *testing.T, r response, status int, typ string) {
	t.Helper()
	require.Equal(t, status, r.status, "body %v", r.body)
	e, ok := r.body["error"].(map[string]any)
	require.True(t, ok, "error body: %v", r.body)
	require.Equal(t, typ, e["type"])
	require.NotEmpty(t, e["message"])
}

func TestAuth_BearerTokens(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{noAnonymous: true})
	acme := b.newTenant(t, "acme")
	revoked := b.newTenant(t, "gone")
	_, err := b.tenants.Revoke(context.Background(), "gone")
	require.NoError(t, err)
	// A well-formed token that no tenant has: another database's.
	_, unknown, err := tenant.NewStore(setup(t, setupOpts{}).pool, nil).Create(context.Background(), "elsewhere", nil)
	require.NoError(t, err)

	t.Run("ValidToken", func(t *testing.T) {
		t.Parallel()
		r := b.do(t, http.MethodPost, "/v1/jobs", minimalSubmit, acme)
		require.Equal(t, http.StatusAccepted, r.status, "body %v", r.body)
		job, err := b.store.Get(context.Background(), r.body["id"].(string))
		require.NoError(t, err)
		require.Equal(t, "acme", job.Tenant)
		require.Equal(t, http.StatusOK, b.do(t, http.MethodGet, "/v1/jobs/"+job.ID, "", acme).status)
	})
	t.Run("SchemeIsCaseInsensitive", func(t *testing.T) {
		t.Parallel()
		h := map[string]string{"Authorization": "bearer " + strings.TrimPrefix(acme["Authorization"], "Bearer ")}
		require.Equal(t, http.StatusAccepted, b.do(t, http.MethodPost, "/v1/jobs", minimalSubmit, h).status)
	})
	for name, auth := range map[string]string{
		"Unknown":       "Bearer " + unknown,
		"Malformed":     "Bearer sk-not-ours",
		"NoToken":       "Bearer ",
		"OtherScheme":   "Basic " + strings.TrimPrefix(acme["Authorization"], "Bearer "),
		"NoScheme":      strings.TrimPrefix(acme["Authorization"], "Bearer "),
		"Empty":         "",
		"TokenPlusJunk": acme["Authorization"] + "x",
	} {
		t.Run(name+"Is401", func(t *testing.T) {
			t.Parallel()
			r := b.do(t, http.MethodPost, "/v1/jobs", minimalSubmit, map[string]string{"Authorization": auth})
			requireError(t, r, http.StatusUnauthorized, "unauthorized")
			require.True(t, strings.HasPrefix(r.header.Get("WWW-Authenticate"), `Bearer realm="llmq"`))
			msg := r.body["error"].(map[string]any)["message"].(string)
			require.NotContains(t, msg, strings.TrimPrefix(acme["Authorization"], "Bearer ")[5:], "no token echoed")
			require.NotContains(t, msg, unknown[5:], "no token echoed")
		})
	}
	t.Run("TwoHeadersIs401", func(t *testing.T) {
		t.Parallel()
		req, err := http.NewRequest(http.MethodPost, b.url+"/v1/jobs", strings.NewReader(minimalSubmit))
		require.NoError(t, err)
		req.Header.Add("Authorization", acme["Authorization"])
		req.Header.Add("Authorization", acme["Authorization"])
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, http.StatusUnauthorized, resp.StatusCode)
	})
	t.Run("NoHeaderWithoutAnonymousIs401", func(t *testing.T) {
		t.Parallel()
		r := b.do(t, http.MethodPost, "/v1/jobs", minimalSubmit, nil)
		requireError(t, r, http.StatusUnauthorized, "unauthorized")
		require.Equal(t, `Bearer realm="llmq"`, r.header.Get("WWW-Authenticate"))
	})
	t.Run("RevokedIs403", func(t *testing.T) {
		t.Parallel()
		for _, m := range []string{http.MethodPost, http.MethodGet, http.MethodDelete} {
			path := "/v1/jobs"
			if m != http.MethodPost {
				path += "/" + b.create(t, "gone").ID
			}
			requireError(t, b.do(t, m, path, minimalSubmit, revoked), http.StatusForbidden, "token_revoked")
		}
	})
	require.Zero(t, countJobs(t, b, "elsewhere"))
}

// TestAuth_RefusedTokenNamesTheProblem: a 401 says what is wrong with the token, without echoing
// it: not the shape of an llmq token (a character lost or added in a copy), an operator's token
// (the console's), or a well-formed token no tenant has.
func TestAuth_RefusedTokenNamesTheProblem(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{noAnonymous: true})
	acme := strings.TrimPrefix(b.newTenant(t, "acme")["Authorization"], "Bearer ")
	_, unknown, err := tenant.NewStore(setup(t, setupOpts{}).pool, nil).Create(context.Background(), "elsewhere", nil)
	require.NoError(t, err)
	for token, want := range map[string]string{
		acme[:len(acme)-1]:              "malformed bearer token: an llmq token is llmq_ followed by 43 letters",
		`"` + acme + `"`:                "malformed bearer token",
		"sk-ant-api03-xyz":              "malformed bearer token",
		"llmqop_" + acme[len("llmq_"):]: "an operator's token",
		unknown:                         "unknown bearer token",
	} {
		r := b.do(t, http.MethodGet, "/v1/jobs/x", "", map[string]string{"Authorization": "Bearer " + token})
		requireError(t, r, http.StatusUnauthorized, "unauthorized")
		msg := r.body["error"].(map[string]any)["message"].(string)
		require.Contains(t, msg, want, "token %q", token)
		require.NotContains(t, msg, acme[len("llmq_"):len("llmq_")+20], "no token echoed")
		require.NotContains(t, msg, unknown[len("llmq_"):], "no token echoed")
	}
}

func TestAuth_AnonymousOnlyWithoutHeader(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})

	r := b.do(t, http.MethodPost, "/v1/jobs", minimalSubmit, nil)
	require.Equal(t, http.StatusAccepted, r.status)
	job, err := b.store.Get(context.Background(), r.body["id"].(string))
	require.NoError(t, err)
	require.Equal(t, tenant.Default, job.Tenant)

	// A header that is present but wrong is not anonymous: it fails.
	requireError(t, b.do(t, http.MethodPost, "/v1/jobs", minimalSubmit, map[string]string{"Authorization": "Bearer nope"}),
		http.StatusUnauthorized, "unauthorized")
}

func TestAuth_TenantsSeeOnlyTheirJobs(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	acme, globex := b.newTenant(t, "acme"), b.newTenant(t, "globex")
	r := b.do(t, http.MethodPost, "/v1/jobs", minimalSubmit, acme)
	require.Equal(t, http.StatusAccepted, r.status)
	id := r.body["id"].(string)

	for who, h := range map[string]map[string]string{"OtherTenant": globex, "Anonymous": nil} {
		t.Run(who, func(t *testing.T) {
			t.Parallel()
			for _, req := range []struct{ method, path string }{
				{http.MethodGet, "/v1/jobs/" + id}, {http.MethodGet, "/v1/jobs/" + id + "/events"}, {http.MethodDelete, "/v1/jobs/" + id},
			} {
				r := b.do(t, req.method, req.path, "", h)
				requireError(t, r, http.StatusNotFound, "not_found")
			}
		})
	}
	t.Run("OwnerStillSeesItQueued", func(t *testing.T) {
		t.Parallel()
		r := b.do(t, http.MethodGet, "/v1/jobs/"+id, "", acme)
		require.Equal(t, http.StatusOK, r.status)
		require.Equal(t, "queued", r.body["status"])
	})
}

func TestAuth_IdempotencyKeysPerTenant(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	acme, globex := b.newTenant(t, "acme"), b.newTenant(t, "globex")
	key := func(h map[string]string) map[string]string {
		return map[string]string{"Authorization": h["Authorization"], "Idempotency-Key": "same-key"}
	}

	a := b.do(t, http.MethodPost, "/v1/jobs", minimalSubmit, key(acme))
	g := b.do(t, http.MethodPost, "/v1/jobs", `{"request":{"model":"other"}}`, key(globex))
	require.Equal(t, http.StatusAccepted, a.status)
	require.Equal(t, http.StatusAccepted, g.status, "another tenant's key never conflicts")
	require.NotEqual(t, a.body["id"], g.body["id"])
	again := b.do(t, http.MethodPost, "/v1/jobs", minimalSubmit, key(acme))
	require.Equal(t, http.StatusOK, again.status)
	require.Equal(t, a.body["id"], again.body["id"])
}

func TestAuth_CredentialRestriction(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{credentials: []string{"default", "cheap", "costly"}})
	h := b.newTenant(t, "acme", "default", "cheap")

	for _, ok := range []string{
		minimalSubmit,
		`{"credential":"cheap","request":{"model":"m"}}`,
		`{"credential":"default","fallbacks":["cheap"],"request":{"model":"m"}}`,
	} {
		require.Equal(t, http.StatusAccepted, b.do(t, http.MethodPost, "/v1/jobs", ok, h).status, ok)
	}
	// A credential the tenant may not use gets the same answer whether it exists ("costly") or
	// not ("nope"), whatever else the body holds: the tenant learns no names.
	for _, refused := range []string{
		`{"credential":"%s","request":{"model":"m"}}`,
		`{"credential":"cheap","fallbacks":["%s"],"request":{"model":"m"}}`,
		`{"credential":"%s","request":{"model":"m"},"timeout":"bad"}`,
		`{"credential":"%s","fallbacks":["default","default"],"request":{"model":"m"}}`,
		`{"credential":"%s","request":{"model":"m","max_tokens":999999999}}`,
	} {
		exists := b.do(t, http.MethodPost, "/v1/jobs", fmt.Sprintf(refused, "costly"), h)
		requireError(t, exists, http.StatusForbidden, "credential_not_allowed")
		missing := b.do(t, http.MethodPost, "/v1/jobs", fmt.Sprintf(refused, "nope"), h)
		require.Equal(t, exists.status, missing.status, refused)
		require.Equal(t, exists.body["error"].(map[string]any)["type"], missing.body["error"].(map[string]any)["type"], refused)
		require.Equal(t, exists.body["error"].(map[string]any)["message"],
			strings.ReplaceAll(missing.body["error"].(map[string]any)["message"].(string), "nope", "costly"), refused)
	}
	// An invalid body is a 400, as for anyone.
	requireError(t, b.do(t, http.MethodPost, "/v1/jobs", `{"request":`, h), http.StatusBadRequest, "invalid_json")
	requireError(t, b.do(t, http.MethodPost, "/v1/jobs", `{"credential":"cheap","request":{"model":"m"},"timeout":"bad"}`, h), http.StatusBadRequest, "invalid_timeout")
	// An unrestricted tenant may use them all.
	require.Equal(t, http.StatusAccepted, b.do(t, http.MethodPost, "/v1/jobs", `{"credential":"costly","request":{"model":"m"}}`, nil).status)
	require.Equal(t, 3, countJobs(t, b, "acme"))
}

func TestAuth_SubmitRate(t *testing.T) {
	t.Parallel()
	prefix := redistest.Prefix(t)
	limiter := func() *tenant.RateLimiter {
		l, err := tenant.NewRateLimiter(redistest.Client(t), &tenant.RateLimiterConfig{
			Rate: tenant.Rate{PerSecond: 0.01, Burst: 3}, Prefix: prefix})
		require.NoError(t, err)
		return l
	}
	// Two replicas on one database, each with its own limiter on the shared Redis.
	one := setup(t, setupOpts{submitRate: limiter()})
	two := setup(t, setupOpts{dbURL: one.dbURL, submitRate: limiter()})
	acme := one.newTenant(t, "acme")

	for i, b := range []*testBundle{one, two, one} {
		require.Equal(t, http.StatusAccepted, b.do(t, http.MethodPost, "/v1/jobs", minimalSubmit, acme).status, "submit %d", i)
	}
	for _, b := range []*testBundle{two, one} {
		r := b.do(t, http.MethodPost, "/v1/jobs", minimalSubmit, acme)
		requireError(t, r, http.StatusTooManyRequests, "rate_limited")
		secs, err := strconv.Atoi(r.header.Get("Retry-After"))
		require.NoError(t, err, "Retry-After %q", r.header.Get("Retry-After"))
		require.GreaterOrEqual(t, secs, 90, "a slot frees every 100s")
		require.LessOrEqual(t, secs, 100)
	}
	// Other tenants have their own budget; reads are not limited.
	require.Equal(t, http.StatusAccepted, two.do(t, http.MethodPost, "/v1/jobs", minimalSubmit, nil).status)
	require.Equal(t, http.StatusNotFound, one.do(t, http.MethodGet, "/v1/jobs/0190a5b2-7c1e-7d3f-9a8b-123456789abc", "", acme).status)
	require.Equal(t, 3, countJobs(t, one, "acme"))
}

func TestAuth_SubmitRateFailsOpenWithoutRedis(t *testing.T) {
	t.Parallel()
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1})
	t.Cleanup(func() { _ = rdb.Close() })
	lim, err := tenant.NewRateLimiter(rdb, &tenant.RateLimiterConfig{Rate: tenant.Rate{PerSecond: 0.01, Burst: 1}})
	require.NoError(t, err)
	b := setup(t, setupOpts{submitRate: lim})

	for range 2 {
		require.Equal(t, http.StatusAccepted, b.do(t, http.MethodPost, "/v1/jobs", minimalSubmit, nil).status)
	}
}

func countJobs(t *testing.T, b *testBundle, tenantName string) int {
	t.Helper()
	var n int
	require.NoError(t, b.pool.QueryRow(context.Background(), `SELECT count(*) FROM jobs WHERE tenant = $1`, tenantName).Scan(&n))
	return n
}

// A stream opened with a bearer token ends once the token is revoked, as every other request of
// it is refused (within the tenants' cache TTL): a leaked token's open streams are cut off too,
// not left to deliver the job's result. Here the cache holds a lookup for 1 ms. It says why
// before it ends (a "refused" event: requireRefused), rather than ending as a dropped connection
// does, after which a client reconnects.
func TestAuth_RevokedTokensStreamEnds(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{noAnonymous: true, tenantTTL: time.Millisecond})
	h := b.newTenant(t, "acme")
	job := b.create(t, "acme")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, b.url+"/v1/jobs/"+job.ID+"/events", nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", h["Authorization"])
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	s := &stream{resp: resp, lines: bufio.NewScanner(resp.Body), cancel: cancel}
	t.Cleanup(s.close)
	require.Equal(t, "queued", s.nextEvent(t).event)

	_, err = b.tenants.Revoke(context.Background(), "acme")
	require.NoError(t, err)
	b.attempt(t, job.ID, jobs.Outcome{Status: jobs.StatusSucceeded, Result: []byte(`{"secret":"answer"}`)})
	requireRefused(t, s.rest(t), "token_revoked") // and not the job's events
}

// TestAuth_AnonymousIsTheStoredDefaultTenant: with api.allow_anonymous, a request without a token
// acts as tenant "default" as the operator stored it (`ctl tenants create default --credentials
// ...`): its credential restriction applies, and once it is revoked anonymous requests are refused
// as its token is. (Its weight, read by name by the workers, applied already.)
func TestAuth_AnonymousIsTheStoredDefaultTenant(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{credentials: []string{"default", "costly"}, tenantTTL: time.Nanosecond})
	costly := `{"credential":"costly","request":{"model":"m"}}`

	// Nothing stored: every credential.
	first := b.do(t, http.MethodPost, "/v1/jobs", costly, nil)
	require.Equal(t, http.StatusAccepted, first.status, first.body)

	token := b.newTenant(t, tenant.Default, "default")
	for _, h := range []map[string]string{nil, token} {
		requireError(t, b.do(t, http.MethodPost, "/v1/jobs", costly, h), http.StatusForbidden, "credential_not_allowed")
		require.Equal(t, http.StatusAccepted, b.do(t, http.MethodPost, "/v1/jobs", minimalSubmit, h).status)
	}

	_, err := b.tenants.Revoke(context.Background(), tenant.Default)
	require.NoError(t, err)
	requireError(t, b.do(t, http.MethodPost, "/v1/jobs", minimalSubmit, nil), http.StatusForbidden, "tenant_revoked")
	requireError(t, b.do(t, http.MethodGet, "/v1/jobs/"+first.body["id"].(string), "", nil), http.StatusForbidden, "tenant_revoked")
	requireError(t, b.do(t, http.MethodPost, "/v1/jobs", minimalSubmit, token), http.StatusForbidden, "token_revoked")
	require.Equal(t, 3, countJobs(t, b, tenant.Default))
}

// TestAuth_RotatedToken: after `ctl tenants rotate`, the new token works at once and the old one
// while its overlap lasts; once the overlap has ended the old one is 401, saying it was rotated
// out (not "unknown"), without echoing it. A revocation ends both with 403.
func TestAuth_RotatedToken(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{noAnonymous: true, tenantTTL: time.Nanosecond})
	old := b.newTenant(t, "acme")
	ctx := context.Background()

	r, err := b.tenants.Rotate(ctx, "acme", time.Hour)
	require.NoError(t, err)
	current := map[string]string{"Authorization": "Bearer " + r.Token}
	for _, h := range []map[string]string{old, current} {
		require.Equal(t, http.StatusAccepted, b.do(t, http.MethodPost, "/v1/jobs", minimalSubmit, h).status)
	}

	r2, err := b.tenants.Rotate(ctx, "acme", 0)
	require.NoError(t, err)
	for _, h := range []map[string]string{old, current} {
		resp := b.do(t, http.MethodPost, "/v1/jobs", minimalSubmit, h)
		requireError(t, resp, http.StatusUnauthorized, "unauthorized")
		require.Equal(t, `Bearer realm="llmq", error="invalid_token"`, resp.header.Get("WWW-Authenticate"))
		msg := resp.body["error"].(map[string]any)["message"].(string)
		require.Contains(t, msg, "rotated-out bearer token")
		require.NotContains(t, msg, strings.TrimPrefix(h["Authorization"], "Bearer llmq_")[:20], "no token echoed")
	}
	newest := map[string]string{"Authorization": "Bearer " + r2.Token}
	require.Equal(t, http.StatusAccepted, b.do(t, http.MethodPost, "/v1/jobs", minimalSubmit, newest).status)

	_, err = b.tenants.Rotate(ctx, "acme", time.Hour)
	require.NoError(t, err)
	_, err = b.tenants.Revoke(ctx, "acme")
	require.NoError(t, err)
	requireError(t, b.do(t, http.MethodPost, "/v1/jobs", minimalSubmit, newest), http.StatusForbidden, "token_revoked")
	require.Equal(t, 3, countJobs(t, b, "acme"))
}
