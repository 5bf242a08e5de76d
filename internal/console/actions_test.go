package console_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/console"
	"github.com/llmq/llmq/internal/credpause"
	"github.com/llmq/llmq/internal/jobs"
	"github.com/llmq/llmq/internal/jobstest"
	"github.com/llmq/llmq/internal/limiter"
	"github.com/llmq/llmq/internal/openapitest"
	"github.com/llmq/llmq/internal/redisscript"
	"github.com/llmq/llmq/internal/redistest"
	"github.com/llmq/llmq/internal/tenant"
)

func jobstestOpts() jobstest.Opts { return jobstest.Opts{} }

type actionResult struct {
	Requested int               `json:"requested"`
	Done      []string          `json:"done"`
	Skipped   map[string]string `json:"skipped"`
}

func TestDeadRetry_SelectionAndAudit(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := b.login(t)
	ctx := context.Background()
	d1 := b.jobs.Dead(t, jobstest.Opts{}, jobs.ReasonRetriesExhausted, 2)
	d2 := b.jobs.Dead(t, jobstest.Opts{}, jobs.ReasonRateLimitedNoRetryAfter, 1)
	queued := b.jobs.Create(t, jobstest.Opts{}) // "changed meanwhile": not dead any more
	const unknown = "00000000-0000-4000-8000-000000000000"

	var res actionResult
	// An ID in capitals names its job too (and is the same job as in lower case).
	c.json(http.MethodPost, "/console/api/dead/retry", map[string]any{"ids": []string{d1.ID, strings.ToUpper(d2.ID), queued.ID, unknown, strings.ToUpper(d1.ID)}}, &res)
	require.Equal(t, 4, res.Requested, "duplicates count once")
	require.Empty(t, res.Skipped[d2.ID])
	require.ElementsMatch(t, []string{d1.ID, d2.ID}, res.Done)
	require.Equal(t, "it is queued now, no longer dead", res.Skipped[queued.ID])
	require.Equal(t, "no such job (purged?)", res.Skipped[unknown])
	for _, id := range []string{d1.ID, d2.ID} {
		j, err := b.jobs.Store.Get(ctx, id)
		require.NoError(t, err)
		require.Equal(t, jobs.StatusQueued, j.Status)
	}
	// Retrying them again (a stale page): nothing done, each named.
	c.json(http.MethodPost, "/console/api/dead/retry", map[string]any{"ids": []string{d1.ID}}, &res)
	require.Empty(t, res.Done)
	require.Contains(t, res.Skipped[d1.ID], "no longer dead")

	entries := b.audit(t)
	require.Equal(t, "dead.retry", entries[0].Action)
	require.Equal(t, 0, entries[0].Count)
	require.Equal(t, d1.ID, entries[0].Target)
	require.Equal(t, "dead.retry", entries[1].Action)
	require.Equal(t, "alice", entries[1].Operator)
	require.Equal(t, 2, entries[1].Count)
	require.Len(t, entries[1].Detail["requested"], 4)

	for body, typ := range map[any]string{
		rawBody(`{"ids": []}`): "invalid_selection",
		rawBody(`{"nope": 1}`): "invalid_body",
		"x":                    "invalid_body",
		rawBody(`{"ids": ["` + d1.ID + `"]} {"ids": []}`): "invalid_body", // one object, nothing after it
	} {
		r, out := c.do(http.MethodPost, "/console/api/dead/retry", body, nil)
		requireError(t, r, out, http.StatusBadRequest, typ)
	}
}

// TestActions_MistypedBodyNamesTheField: a body of another JSON type than its action's, or a
// field of one, is 400 invalid_body naming the field and the JSON it takes; the message named Go
// types ("Go struct field selection.ids of type string").
func TestActions_MistypedBodyNamesTheField(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := b.login(t)
	for body, msg := range map[string]string{
		`[]`:             "the request body must be a JSON object of this action, not an array",
		`"x"`:            "the request body must be a JSON object of this action, not a string",
		`{"ids":[1]}`:    `field \"ids\" of the request body: a number where a string belongs`,
		`{"ids":"x"}`:    `field \"ids\" of the request body: a string where an array belongs`,
		`{"ids":{}}`:     `field \"ids\" of the request body: an object where an array belongs`,
		`{"ids":[true]}`: `field \"ids\" of the request body: a boolean where a string belongs`,
	} {
		r, out := c.do(http.MethodPost, "/console/api/dead/retry", rawBody(body), nil)
		requireError(t, r, out, http.StatusBadRequest, "invalid_body")
		require.Contains(t, out, msg, body)
		require.NotContains(t, out, "Go ", body)
	}
	r, out := c.do(http.MethodPost, "/console/api/tenants", rawBody(`{"name":"acme","credentials":"default"}`), nil)
	requireError(t, r, out, http.StatusBadRequest, "invalid_body")
	require.Contains(t, out, `field \"credentials\" of the request body: a string where an array belongs`)
}

func TestDeadPurge_SelectionAndAudit(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := b.login(t)
	d1 := b.jobs.Dead(t, jobstest.Opts{}, jobs.ReasonRetriesExhausted, 1)
	d2 := b.jobs.Dead(t, jobstest.Opts{Credential: "other"}, jobs.ReasonRetriesExhausted, 1)
	queued := b.jobs.Create(t, jobstest.Opts{})

	var list struct {
		Jobs []struct {
			ID     string `json:"id"`
			Tenant string `json:"tenant"`
		} `json:"jobs"`
	}
	c.json(http.MethodGet, "/console/api/dead?credential=other", nil, &list)
	require.Len(t, list.Jobs, 1)
	require.Equal(t, d2.ID, list.Jobs[0].ID)
	require.Equal(t, "default", list.Jobs[0].Tenant)

	var res actionResult
	c.json(http.MethodPost, "/console/api/dead/purge", map[string]any{"ids": []string{d1.ID, strings.ToUpper(d2.ID), queued.ID}}, &res)
	require.ElementsMatch(t, []string{d1.ID, d2.ID}, res.Done)
	require.Len(t, res.Skipped, 1)
	require.Contains(t, res.Skipped[queued.ID], "queued")
	require.Zero(t, b.jobs.Rows(t, d1.ID)["jobs"])
	require.Zero(t, b.jobs.Rows(t, d1.ID)["job_attempts"])
	c.json(http.MethodGet, "/console/api/dead", nil, &list)
	require.Empty(t, list.Jobs)
	// The job page of a purged job says so.
	r, out := c.do(http.MethodGet, "/console/api/jobs/"+d1.ID, nil, nil)
	requireError(t, r, out, http.StatusNotFound, "not_found")

	e := b.audit(t)[0]
	require.Equal(t, "dead.purge", e.Action)
	require.Equal(t, 2, e.Count)
}

// TestJobCancel_Audited: an operator cancels a queued job from its page: it ends canceled with
// its event, the audit log names the operator; a second cancel answers that it was already
// canceled, a cancel of a job that ended otherwise is 409 job_terminal naming the status, an
// unknown job 404, and a cancel without the session's CSRF token is refused.
func TestJobCancel_Audited(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := b.login(t)
	ctx := context.Background()
	queued := b.jobs.Create(t, jobstest.Opts{})

	var res struct {
		Message string `json:"message"`
		Changed bool   `json:"changed"`
	}
	c.json(http.MethodPost, "/console/api/jobs/"+queued.ID+"/cancel", nil, &res)
	require.True(t, res.Changed)
	require.Equal(t, "job "+queued.ID+" canceled", res.Message)
	j, err := b.jobs.Store.Get(ctx, queued.ID)
	require.NoError(t, err)
	require.Equal(t, jobs.StatusCanceled, j.Status)
	evs, err := b.jobs.Store.Events(ctx, queued.ID, 0)
	require.NoError(t, err)
	require.Equal(t, jobs.StatusCanceled, evs[len(evs)-1].Type)

	b.mu.Lock()
	require.Equal(t, []string{"default"}, b.canceled, "counted once, by its credential")
	b.mu.Unlock()
	audited := b.audit(t)
	e := audited[0]
	require.Equal(t, "job.cancel", e.Action)
	require.Equal(t, "alice", e.Operator)
	require.Equal(t, queued.ID, e.Target)

	// A second cancel (another operator's, or this one's sent again) finds it done: 200, changed
	// false, neither counted nor audited again. It was 409 job_terminal "it is canceled".
	c.json(http.MethodPost, "/console/api/jobs/"+queued.ID+"/cancel", nil, &res)
	require.False(t, res.Changed)
	require.Equal(t, "job "+queued.ID+" was already canceled", res.Message)
	require.Equal(t, audited, b.audit(t), "audited once")
	b.mu.Lock()
	require.Equal(t, []string{"default"}, b.canceled, "counted once")
	b.mu.Unlock()
	succeeded := b.jobs.Create(t, jobstest.Opts{})
	b.jobs.Attempt(t, succeeded.ID, jobs.Outcome{Status: jobs.StatusSucceeded, Result: []byte(`{}`)})
	r, out := c.do(http.MethodPost, "/console/api/jobs/"+succeeded.ID+"/cancel", nil, nil)
	requireError(t, r, out, http.StatusConflict, "job_terminal")
	require.Contains(t, out, "it is succeeded")
	r, out = c.do(http.MethodPost, "/console/api/jobs/00000000-0000-4000-8000-000000000000/cancel", nil, nil)
	requireError(t, r, out, http.StatusNotFound, "not_found")
	r, out = c.do(http.MethodPost, "/console/api/jobs/nope/cancel", nil, nil)
	requireError(t, r, out, http.StatusNotFound, "not_found")

	other := b.jobs.Create(t, jobstest.Opts{})
	r, _ = c.do(http.MethodPost, "/console/api/jobs/"+other.ID+"/cancel", nil, http.Header{"X-CSRF-Token": {"wrong"}})
	require.Equal(t, http.StatusForbidden, r.StatusCode)
	j, err = b.jobs.Store.Get(ctx, other.ID)
	require.NoError(t, err)
	require.Equal(t, jobs.StatusQueued, j.Status, "refused without the CSRF token")
	require.Len(t, b.audit(t), 2, "login and the one cancel")
	b.mu.Lock()
	require.Len(t, b.canceled, 1, "refused and terminal cancels are not counted")
	b.mu.Unlock()
}

func TestTenants_CreateRevokeAudited(t *testing.T) {
	t.Parallel()
	b := setup(t, console.Credential{Name: "default", Provider: "anthropic"})
	c := b.login(t)
	var created struct {
		Tenant tenant.Tenant `json:"tenant"`
		Token  string        `json:"token"`
	}
	c.json(http.MethodPost, "/console/api/tenants", map[string]any{"name": "acme", "credentials": []string{"default"}}, &created)
	require.Equal(t, "acme", created.Tenant.Name)
	got, err := tenant.NewStore(b.jobs.Pool, nil).Authenticate(context.Background(), created.Token)
	require.NoError(t, err, "the token shown works")
	require.Equal(t, []string{"default"}, got.Credentials)

	r, out := c.do(http.MethodPost, "/console/api/tenants", map[string]any{"name": "acme"}, nil)
	requireError(t, r, out, http.StatusConflict, "tenant_exists")
	// A name that differs from acme's only in case would make a tenant no one tells apart.
	r, out = c.do(http.MethodPost, "/console/api/tenants", map[string]any{"name": "ACME"}, nil)
	requireError(t, r, out, http.StatusConflict, "tenant_exists")
	require.Contains(t, out, `tenant \"acme\"`, "names the tenant that exists")
	r, out = c.do(http.MethodPost, "/console/api/tenants", map[string]any{"name": "a b"}, nil)
	requireError(t, r, out, http.StatusBadRequest, "invalid_name")
	r, out = c.do(http.MethodPost, "/console/api/tenants", map[string]any{"name": "x", "credentials": []string{"nope"}}, nil)
	requireError(t, r, out, http.StatusBadRequest, "unknown_credential")
	r, out = c.do(http.MethodPost, "/console/api/tenants", map[string]any{"name": "x", "credentials": []string{"default", "default"}}, nil)
	requireError(t, r, out, http.StatusBadRequest, "duplicate_credential")

	var list struct {
		Tenants []tenant.Tenant `json:"tenants"`
	}
	c.json(http.MethodGet, "/console/api/tenants", nil, &list)
	require.Len(t, list.Tenants, 1)
	require.NotContains(t, out, created.Token)

	var rev struct {
		Changed bool `json:"changed"`
	}
	c.json(http.MethodPost, "/console/api/tenants/acme/revoke", nil, &rev)
	require.True(t, rev.Changed)
	c.json(http.MethodPost, "/console/api/tenants/acme/revoke", nil, &rev)
	require.False(t, rev.Changed)
	r, out = c.do(http.MethodPost, "/console/api/tenants/nobody/revoke", nil, nil)
	requireError(t, r, out, http.StatusNotFound, "not_found")

	entries := b.audit(t)
	require.Equal(t, []string{"tenant.revoke", "tenant.create", "login"},
		[]string{entries[0].Action, entries[1].Action, entries[2].Action}, "the revoke that changed nothing is not audited, as in ctl")
	require.Equal(t, 1, entries[0].Count)
	require.Equal(t, "acme", entries[1].Target)
}

// TestTenants_EmptyCredentialListIsRefused: a tenant created with "credentials": [] is refused
// (as `ctl tenants create --credentials ""` is), not given every credential: an empty list
// reads as "none", and widening it to "all" gave the tenant the opposite of what was asked.
// null, or no field, is every credential.
func TestTenants_EmptyCredentialListIsRefused(t *testing.T) {
	t.Parallel()
	b := setup(t, console.Credential{Name: "default", Provider: "anthropic"})
	c := b.login(t)
	r, out := c.do(http.MethodPost, "/console/api/tenants", map[string]any{"name": "none", "credentials": []string{}}, nil)
	requireError(t, r, out, http.StatusBadRequest, "invalid_credentials")
	require.Contains(t, out, "name at least one credential")
	_, err := tenant.NewStore(b.jobs.Pool, nil).Get(context.Background(), "none")
	require.ErrorIs(t, err, tenant.ErrNotFound, "nothing created")

	var created struct {
		Tenant tenant.Tenant `json:"tenant"`
	}
	c.json(http.MethodPost, "/console/api/tenants", map[string]any{"name": "all", "credentials": nil}, &created)
	require.Nil(t, created.Tenant.Credentials, "null: every credential")
}

// TestTenants_Weight: a tenant created with a weight (absent: the default), the weight changed
// and listed, the change audited; a weight out of range is 400 invalid_weight naming the range,
// an unknown tenant 404.
func TestTenants_Weight(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := b.login(t)
	var res struct {
		Message string `json:"message"`
	}
	c.json(http.MethodPost, "/console/api/tenants", map[string]any{"name": "big", "weight": 3}, &res)
	c.json(http.MethodPost, "/console/api/tenants", map[string]any{"name": "small"}, &res)
	c.json(http.MethodPost, "/console/api/tenants/small/weight", map[string]any{"weight": 2}, &res)
	require.Equal(t, "tenant small: weight 2", res.Message)

	var list struct {
		Tenants []tenant.Tenant `json:"tenants"`
	}
	c.json(http.MethodGet, "/console/api/tenants", nil, &list)
	weights := map[string]int{}
	for _, tn := range list.Tenants {
		weights[tn.Name] = tn.Weight
	}
	require.Equal(t, map[string]int{"big": 3, "small": 2}, weights)

	for _, w := range []int{0, 1001} {
		r, out := c.do(http.MethodPost, "/console/api/tenants/small/weight", map[string]any{"weight": w}, nil)
		requireError(t, r, out, http.StatusBadRequest, "invalid_weight")
		require.Contains(t, out, "in 1..1000")
	}
	r, out := c.do(http.MethodPost, "/console/api/tenants", map[string]any{"name": "huge", "weight": 5000}, nil)
	requireError(t, r, out, http.StatusBadRequest, "invalid_weight")
	r, out = c.do(http.MethodPost, "/console/api/tenants/nobody/weight", map[string]any{"weight": 2}, nil)
	requireError(t, r, out, http.StatusNotFound, "not_found")
	r, out = c.do(http.MethodPost, "/console/api/tenants/small/weight", map[string]any{"weight": "2"}, nil)
	requireError(t, r, out, http.StatusBadRequest, "invalid_weight")

	e := b.audit(t)[0]
	require.Equal(t, "tenant.weight", e.Action)
	require.Equal(t, "small", e.Target)
	require.Equal(t, map[string]any{"weight": float64(2)}, e.Detail)
	require.Equal(t, map[string]any{"credentials": nil, "weight": float64(3)}, b.audit(t)[2].Detail, "big's create")
}

// TestTenants_WeightRefusedNamesTheField: every weight ctl tenants set --weight would not take
// (absent, null, a string, a fraction, 0, negative, past 1000, past any int) is 400
// invalid_weight naming the field and its range, and changes nothing: an absent or null weight
// was the 0 the client never sent, and a string or a fraction an invalid_body naming a Go type.
func TestTenants_WeightRefusedNamesTheField(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := b.login(t)
	var created struct{}
	c.json(http.MethodPost, "/console/api/tenants", map[string]any{"name": "acme", "weight": 3}, &created)
	for body, msg := range map[string]string{
		`{}`:              "weight is required: a whole number in 1..1000",
		`{"weight":null}`: "weight is required: a whole number in 1..1000",
		`{"weight":"2"}`:  `weight \"2\": want a whole number in 1..1000`,
		`{"weight":1.5}`:  "weight 1.5: want a whole number in 1..1000",
		`{"weight":0}`:    "weight 0: want a whole number in 1..1000",
		`{"weight":-1}`:   "weight -1: want a whole number in 1..1000",
		`{"weight":1001}`: "weight 1001: want a whole number in 1..1000",
		`{"weight":1e30}`: "weight 1e30: want a whole number in 1..1000",
		`{"weight":[2]}`:  "weight [2]: want a whole number in 1..1000",
	} {
		r, out := c.do(http.MethodPost, "/console/api/tenants/acme/weight", rawBody(body), nil)
		requireError(t, r, out, http.StatusBadRequest, "invalid_weight")
		require.Contains(t, out, msg, body)
	}
	var list struct {
		Tenants []tenant.Tenant `json:"tenants"`
	}
	c.json(http.MethodGet, "/console/api/tenants", nil, &list)
	require.Len(t, list.Tenants, 1)
	require.Equal(t, 3, list.Tenants[0].Weight, "no refused weight was set")
	var res struct {
		Message string `json:"message"`
	}
	c.json(http.MethodPost, "/console/api/tenants/acme/weight", rawBody(`{"weight":1000}`), &res)
	require.Equal(t, "tenant acme: weight 1000", res.Message)
}

// TestTenants_RotateOverlapRefusedNamesTheField: every overlap_seconds that is not a whole
// number of seconds in range (a string, a fraction, a boolean, an array, negative, past the
// maximum, past any int) is 400 invalid_overlap naming the field and its range, and rotates
// nothing; a string or a fraction was invalid_body naming a Go type ("Go struct field
// .overlap_seconds of type int64").
func TestTenants_RotateOverlapRefusedNamesTheField(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := b.login(t)
	store := tenant.NewStore(b.jobs.Pool, nil)
	ctx := context.Background()
	_, old, err := store.Create(ctx, "acme", nil)
	require.NoError(t, err)
	maxSeconds := int64(tenant.MaxOverlap / time.Second)
	for body, msg := range map[string]string{
		`{"overlap_seconds":"60"}`:    `overlap_seconds \"60\": want a whole number of seconds in 0..` + fmt.Sprint(maxSeconds),
		`{"overlap_seconds":1.5}`:     "overlap_seconds 1.5: want a whole number of seconds in 0..",
		`{"overlap_seconds":1e300}`:   "overlap_seconds 1e300: want a whole number of seconds in 0..",
		`{"overlap_seconds":true}`:    "overlap_seconds true: want a whole number of seconds in 0..",
		`{"overlap_seconds":[60]}`:    "overlap_seconds [60]: want a whole number of seconds in 0..",
		`{"overlap_seconds":{}}`:      "overlap_seconds {}: want a whole number of seconds in 0..",
		`{"overlap_seconds":-1}`:      "overlap_seconds -1: want a whole number of seconds in 0..",
		`{"overlap_seconds":2592001}`: "overlap_seconds 2592001: want a whole number of seconds in 0..",
	} {
		r, out := c.do(http.MethodPost, "/console/api/tenants/acme/rotate", rawBody(body), nil)
		requireError(t, r, out, http.StatusBadRequest, "invalid_overlap")
		require.Contains(t, out, msg, body)
	}
	_, err = store.Authenticate(ctx, old)
	require.NoError(t, err, "no refused overlap rotated the token")
	for _, e := range b.audit(t) {
		require.NotEqual(t, "tenant.rotate", e.Action, "no refused overlap was audited")
	}
}

// TestTenants_CreateWeightRefusedNamesTheField: a create's weight is refused as ctl tenants
// create --weight refuses it: 0, a string, a fraction or a number past the range is 400
// invalid_weight naming the field and its range, and no tenant is created; absent or null is
// the default. 0 was taken as the default, and a string was invalid_body naming a Go type.
func TestTenants_CreateWeightRefusedNamesTheField(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := b.login(t)
	for weight, msg := range map[string]string{
		`"2"`:  `weight \"2\": want a whole number in 1..1000`,
		`1.5`:  "weight 1.5: want a whole number in 1..1000",
		`0`:    "weight 0: want a whole number in 1..1000",
		`-1`:   "weight -1: want a whole number in 1..1000",
		`1001`: "weight 1001: want a whole number in 1..1000",
		`true`: "weight true: want a whole number in 1..1000",
	} {
		r, out := c.do(http.MethodPost, "/console/api/tenants", rawBody(`{"name":"acme","weight":`+weight+`}`), nil)
		requireError(t, r, out, http.StatusBadRequest, "invalid_weight")
		require.Contains(t, out, msg, weight)
	}
	var list struct {
		Tenants []tenant.Tenant `json:"tenants"`
	}
	c.json(http.MethodGet, "/console/api/tenants", nil, &list)
	require.Empty(t, list.Tenants, "no refused weight created a tenant")

	var created struct {
		Tenant tenant.Tenant `json:"tenant"`
	}
	c.json(http.MethodPost, "/console/api/tenants", rawBody(`{"name":"absent"}`), &created)
	require.Equal(t, tenant.DefaultWeight, created.Tenant.Weight, "absent: the default")
	c.json(http.MethodPost, "/console/api/tenants", rawBody(`{"name":"null","weight":null}`), &created)
	require.Equal(t, tenant.DefaultWeight, created.Tenant.Weight, "null: the default")
	c.json(http.MethodPost, "/console/api/tenants", rawBody(`{"name":"top","weight":1000}`), &created)
	require.Equal(t, 1000, created.Tenant.Weight)
}

func TestCredentials_StateAndResume(t *testing.T) {
	t.Parallel()
	b := setup(t, console.Credential{Name: "default", Provider: "anthropic", RequestsPerSecond: 10, Burst: 20},
		console.Credential{Name: "unseen", Provider: "openai"})
	c := b.login(t)
	ctx := context.Background()
	// A worker published the tag of "default" and paused it.
	tag := redisscript.CredentialTag("anthropic\x00http://sim\x00key")
	require.NoError(t, b.rdb.HSet(ctx, redisscript.CredentialIndexKey(b.prefix), "default", tag).Err())
	lim, err := limiter.New(b.rdb, &limiter.Config{Prefix: b.prefix})
	require.NoError(t, err)
	pauses := credpause.NewStore(b.jobs.Pool, nil)
	_, err = pauses.Pause(ctx, lim.GateByTag(tag, "default"), "rate_limited_no_retry_after", "job-1")
	require.NoError(t, err)

	var list struct {
		Credentials []console.CredentialState `json:"credentials"`
	}
	c.json(http.MethodGet, "/console/api/credentials", nil, &list)
	require.Len(t, list.Credentials, 2)
	def, unseen := list.Credentials[0], list.Credentials[1]
	require.True(t, def.Known)
	require.True(t, def.Paused)
	require.Equal(t, "job-1", def.FirstJobID)
	require.Equal(t, "configured", def.LimitSource)
	require.InDelta(t, 10, def.RatePerSec, 0.001)
	require.Equal(t, 20, def.Burst)
	require.Equal(t, "closed", def.Breaker)
	require.False(t, unseen.Known)

	var res struct {
		Message string `json:"message"`
		Changed bool   `json:"changed"`
	}
	c.json(http.MethodPost, "/console/api/credentials/default/resume", nil, &res)
	require.True(t, res.Changed)
	ps, err := lim.GateByTag(tag, "default").Paused(ctx)
	require.NoError(t, err)
	require.False(t, ps.Paused)
	// Nor in Postgres, from where a Redis that lost its data would get the pause back.
	ps, err = pauses.Get(ctx, lim.GateByTag(tag, "default"))
	require.NoError(t, err)
	require.False(t, ps.Paused, "the pause Postgres keeps outlived the resume")
	c.json(http.MethodPost, "/console/api/credentials/default/resume", nil, &res)
	require.False(t, res.Changed)
	require.Contains(t, res.Message, "neither paused nor pushed back")
	r, out := c.do(http.MethodPost, "/console/api/credentials/unseen/resume", nil, nil)
	requireError(t, r, out, http.StatusConflict, "state_unknown")
	r, out = c.do(http.MethodPost, "/console/api/credentials/nope/resume", nil, nil)
	requireError(t, r, out, http.StatusNotFound, "not_found")

	e := b.audit(t)
	require.Equal(t, "credential.resume", e[0].Action)
	require.Equal(t, 0, e[0].Count)
	require.Equal(t, 1, e[1].Count)
	require.Equal(t, "default", e[1].Target)
}

// TestCredentials_StateReadsAPauseRedisLost: right after Redis lost its data, the credentials
// view tells a credential paused by a spend cap as paused (Postgres keeps the pause), not as not
// paused until a worker's refresh restores it.
func TestCredentials_StateReadsAPauseRedisLost(t *testing.T) {
	t.Parallel()
	b := setup(t, console.Credential{Name: "default", Provider: "anthropic"})
	c := b.login(t)
	ctx := context.Background()
	tag := redisscript.CredentialTag("anthropic\x00http://sim\x00key")
	publish := func() {
		require.NoError(t, b.rdb.HSet(ctx, redisscript.CredentialIndexKey(b.prefix), "default", tag).Err())
	}
	publish()
	lim, err := limiter.New(b.rdb, &limiter.Config{Prefix: b.prefix})
	require.NoError(t, err)
	pauses := credpause.NewStore(b.jobs.Pool, nil)
	_, err = pauses.Pause(ctx, lim.GateByTag(tag, "default"), "rate_limited_no_retry_after", "job-1")
	require.NoError(t, err)
	// Redis loses its data; a worker publishes the credentials' tags again.
	lctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	redistest.Unlink(lctx, b.rdb, b.prefix+"*")
	publish()

	var list struct {
		Credentials []console.CredentialState `json:"credentials"`
	}
	c.json(http.MethodGet, "/console/api/credentials", nil, &list)
	require.Len(t, list.Credentials, 1)
	require.True(t, list.Credentials[0].Known)
	require.True(t, list.Credentials[0].Paused, "a pause Postgres keeps shows as not paused after Redis lost it")
	require.Equal(t, "job-1", list.Credentials[0].FirstJobID)
	ps, err := lim.GateByTag(tag, "default").Paused(ctx)
	require.NoError(t, err)
	require.True(t, ps.Paused, "the pause is back in Redis")
}

func TestBadInput_ClearMessagesNever500(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := b.login(t)
	for _, tc := range []struct {
		path   string
		status int
		typ    string
	}{
		{"/console/api/jobs/00000000-0000-4000-8000-000000000000", 404, "not_found"},
		{"/console/api/jobs/not-an-id", 404, "not_found"},
		{"/console/api/jobs/not-an-id/live", 404, "not_found"},
		{"/console/api/jobs?after=garbage", 400, "stale_page"},
		{"/console/api/jobs?after=" + "MTIzLHh4eA", 400, "stale_page"},
		{"/console/api/jobs?status=lost", 400, "invalid_status"},
		{"/console/api/jobs?limit=0", 400, "invalid_limit"},
		{"/console/api/nothing", 404, "not_found"},
	} {
		r, out := c.do(http.MethodGet, tc.path, nil, nil)
		requireError(t, r, out, tc.status, tc.typ)
	}
}

// TestBadInput_TextPostgresCannotHoldNever500: a filter or a name holding NUL or bytes that are
// not UTF-8, or a cursor whose time Postgres cannot hold, names nothing stored; sent to Postgres
// as a parameter it would fail the query, a 500. Each is a 4xx naming the problem.
func TestBadInput_TextPostgresCannotHoldNever500(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := b.login(t)
	cursor := func(s string) string { return base64.RawURLEncoding.EncodeToString([]byte(s)) }
	for _, tc := range []struct {
		path   string
		status int
		typ    string
	}{
		{"/console/api/jobs?tenant=%00", 400, "invalid_filter"},
		{"/console/api/jobs?tenant=%ff", 400, "invalid_filter"},
		{"/console/api/jobs?credential=a%00b", 400, "invalid_filter"},
		{"/console/api/dead?reason=%00", 400, "invalid_filter"},
		{"/console/api/dead?credential=%c3%28", 400, "invalid_filter"},
		// Before 4713 BC, the first time Postgres holds.
		{"/console/api/jobs?after=" + cursor("-300000000000000000,00000000-0000-4000-8000-000000000000"), 400, "stale_page"},
	} {
		r, out := c.do(http.MethodGet, tc.path, nil, nil)
		requireError(t, r, out, tc.status, tc.typ)
	}
	for _, name := range []string{"%00", "%ff", "a%00"} {
		r, out := c.do(http.MethodPost, "/console/api/tenants/"+name+"/revoke", nil, nil)
		requireError(t, r, out, http.StatusNotFound, "not_found")
		r, out = c.do(http.MethodPost, "/console/api/tenants/"+name+"/weight", map[string]any{"weight": 2}, nil)
		requireError(t, r, out, http.StatusNotFound, "not_found")
	}
	e := b.audit(t)
	require.Len(t, e, 1, "nothing was done: only the login is audited")
	require.Equal(t, "login", e[0].Action)
}

func TestJobs_PagedNewestFirst(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := b.login(t)
	var made []string
	for range 5 {
		made = append(made, b.jobs.Create(t, jobstest.Opts{}).ID)
	}
	b.jobs.Dead(t, jobstest.Opts{Credential: "other"}, jobs.ReasonRetriesExhausted, 1)

	type page struct {
		Jobs []struct {
			ID     string `json:"id"`
			Status string `json:"status"`
		} `json:"jobs"`
		Next string `json:"next"`
	}
	var seen []string
	next := ""
	for i := 0; ; i++ {
		var p page
		c.json(http.MethodGet, "/console/api/jobs?status=queued&limit=2&after="+next, nil, &p)
		for _, j := range p.Jobs {
			require.Equal(t, "queued", j.Status)
			seen = append(seen, j.ID)
		}
		if p.Next == "" {
			break
		}
		require.Less(t, i, 5)
		next = p.Next
	}
	require.Len(t, seen, 5)
	for i := range seen {
		require.Equal(t, made[len(made)-1-i], seen[i], "newest first")
	}
	// Rows carry no result (the job page does).
	done := b.jobs.Create(t, jobstest.Opts{Credential: "third"})
	b.jobs.Attempt(t, done.ID, jobs.Outcome{Status: jobs.StatusSucceeded, Result: json.RawMessage(`{"big":"answer"}`)})
	r, out := c.do(http.MethodGet, "/console/api/jobs?credential=third", nil, nil)
	require.Equal(t, http.StatusOK, r.StatusCode)
	require.Contains(t, out, done.ID)
	require.NotContains(t, out, "big")
	r, out = c.do(http.MethodGet, "/console/api/jobs/"+done.ID, nil, nil)
	require.Equal(t, http.StatusOK, r.StatusCode)
	require.Contains(t, out, `"big":"answer"`)

	var p page
	c.json(http.MethodGet, "/console/api/jobs?credential=other", nil, &p)
	require.Len(t, p.Jobs, 1)
	c.json(http.MethodGet, "/console/api/jobs?tenant=nobody", nil, &p)
	require.Empty(t, p.Jobs)
}

func TestOverview_FiguresOfCtlStats(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := b.login(t)
	b.jobs.Create(t, jobstest.Opts{})
	b.jobs.Dead(t, jobstest.Opts{}, jobs.ReasonRetriesExhausted, 2)
	b.jobs.Dead(t, jobstest.Opts{}, jobs.ReasonRateLimitedNoRetryAfter, 1)
	var ov console.Overview
	c.json(http.MethodGet, "/console/api/overview", nil, &ov)
	require.Equal(t, 1, ov.ByStatus[jobs.StatusQueued])
	require.Equal(t, 2, ov.ByStatus[jobs.StatusDead])
	require.Equal(t, 0, ov.ByStatus[jobs.StatusSucceeded], "every status present")
	require.Equal(t, 3, ov.Attempts)
	require.Equal(t, 3, ov.Submitted, "jobs_submitted, as ctl stats' \"jobs submitted\"")
	require.Equal(t, map[string]int{jobs.ReasonRetriesExhausted: 1, jobs.ReasonRateLimitedNoRetryAfter: 1}, ov.DeadByReason)
}

func TestCredentials_RedisDownIs503(t *testing.T) {
	t.Parallel()
	b := setup(t)
	down := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1, DialTimeout: time.Second})
	t.Cleanup(func() { _ = down.Close() })
	h, err := console.New(console.Config{Pool: b.jobs.Pool, Jobs: b.jobs.Store, Redis: down,
		Credentials: []console.Credential{{Name: "default", Provider: "anthropic"}}})
	require.NoError(t, err)
	b.srv = httptest.NewServer(openapitest.Handler(t, h))
	t.Cleanup(b.srv.Close)
	c := b.login(t)
	r, out := c.do(http.MethodGet, "/console/api/credentials", nil, nil)
	requireError(t, r, out, http.StatusServiceUnavailable, "unavailable")
	r, out = c.do(http.MethodPost, "/console/api/credentials/default/resume", nil, nil)
	requireError(t, r, out, http.StatusServiceUnavailable, "unavailable")
	// The pages that need only Postgres still work.
	r, out = c.do(http.MethodGet, "/console/api/overview", nil, nil)
	require.Equal(t, http.StatusOK, r.StatusCode, out)
}

// TestDeadRetry_SelectionIsOneTransaction: a console retry of a selection larger than
// RetryDead's default batch (500; a selection holds up to 1000) is one transaction, as an
// answer about the selection needs: when it fails, no job of the selection was put back. In
// batches, a failure of the second left the first 500 queued behind an error answer, with no
// audit entry and no task (they waited for the sweeper).
func TestDeadRetry_SelectionIsOneTransaction(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := b.login(t)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	// Given 501 dead jobs, dead a second apart; the last to die (in a second batch) locked.
	rows, err := b.jobs.Pool.Query(ctx, `INSERT INTO jobs (id, credential, fingerprint, status, request, max_attempts,
	timeout_ms, deadline, dead_reason, finished_at)
SELECT gen_random_uuid(), 'default', 'f', 'dead', '{}', 3, 60000, now(), 'retries_exhausted', now() - g * interval '1 second'
FROM generate_series(1, 501) g ORDER BY g RETURNING id::text`)
	require.NoError(t, err)
	dead, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	lock, err := b.jobs.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = lock.Rollback(context.WithoutCancel(ctx)) }()
	_, err = lock.Exec(ctx, `SELECT 1 FROM jobs WHERE id = $1 FOR UPDATE`, dead[0])
	require.NoError(t, err)

	// The retry waits for the locked job, and its statement fails there (canceled).
	body, err := json.Marshal(map[string]any{"ids": dead})
	require.NoError(t, err)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.base+"/console/api/dead/retry", strings.NewReader(string(body)))
	require.NoError(t, err)
	req.Header.Set("X-CSRF-Token", c.csrf)
	answered := make(chan int, 1)
	go func() {
		res, err := c.http.Do(req)
		if err != nil {
			answered <- 0
			return
		}
		res.Body.Close()
		answered <- res.StatusCode
	}()
	var pid int
	require.Eventually(t, func() bool { // on testify's goroutine: no require here
		return b.jobs.Pool.QueryRow(ctx, `SELECT pid FROM pg_stat_activity
WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&pid) == nil
	}, 30*time.Second, 10*time.Millisecond, "the retry waits for the locked job")
	_, err = b.jobs.Pool.Exec(ctx, `SELECT pg_cancel_backend($1)`, pid)
	require.NoError(t, err)
	var status int
	select {
	case status = <-answered:
	case <-ctx.Done():
		t.Fatal("no answer")
	}
	require.GreaterOrEqual(t, status, 500, "the retry failed")
	require.NoError(t, lock.Rollback(ctx))

	// Then no job of the selection was put back.
	var queued int
	require.NoError(t, b.jobs.Pool.QueryRow(ctx, `SELECT count(*) FROM jobs WHERE status <> 'dead'`).Scan(&queued))
	require.Zero(t, queued, "an error answer, and jobs of the selection queued")
	for _, e := range b.audit(t) {
		require.NotEqual(t, "dead.retry", e.Action)
	}
}

// TestDeadActions_ANULInTheSelectionIsRefused: an ID holding NUL names no job, and the audit
// log (Postgres text and jsonb) cannot hold it: a selection with one beside a real dead letter
// retried or purged the job and lost its audit entry (the write failed, logged only), so an
// operator could act unrecorded. Such a selection is a 400 and nothing is done.
func TestDeadActions_ANULInTheSelectionIsRefused(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := b.login(t)
	dead := b.jobs.Dead(t, jobstest.Opts{}, jobs.ReasonRetriesExhausted, 1)
	for _, action := range []string{"retry", "purge"} {
		r, out := c.do(http.MethodPost, "/console/api/dead/"+action, map[string]any{"ids": []string{dead.ID, "\x00"}}, nil)
		requireError(t, r, out, http.StatusBadRequest, "invalid_selection")
	}
	j, err := b.jobs.Store.Get(context.Background(), dead.ID)
	require.NoError(t, err)
	require.Equal(t, jobs.StatusDead, j.Status, "neither retried nor purged")
	e := b.audit(t)
	require.Len(t, e, 1, "nothing was done: only the login is audited")
	require.Equal(t, "login", e[0].Action)
}

// failKey is a go-redis hook that fails, before it is sent, every command naming key: Redis
// failing that one write.
type failKey struct{ key string }

func (failKey) DialHook(next redis.DialHook) redis.DialHook { return next }

func (f failKey) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		for _, a := range cmd.Args() {
			if s, ok := a.(string); ok && s == f.key {
				cmd.SetErr(errors.New("injected: Redis failed"))
				return cmd.Err()
			}
		}
		return next(ctx, cmd)
	}
}

func (failKey) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// TestCredentials_AResumeWhosePushBackClearFailsIsAudited: the resume ends the pause (Postgres
// and Redis), then clears the Retry-After push-back; when that second write fails the answer is
// a 503, but the pause has ended: the audit log records it. It recorded nothing, so a credential
// resumed from the console (the pause gone, its jobs sent again) left no trace.
func TestCredentials_AResumeWhosePushBackClearFailsIsAudited(t *testing.T) {
	t.Parallel()
	b := setup(t, console.Credential{Name: "default", Provider: "anthropic"})
	c := b.login(t)
	ctx := context.Background()
	tag := redisscript.CredentialTag("anthropic\x00http://sim\x00key")
	require.NoError(t, b.rdb.HSet(ctx, redisscript.CredentialIndexKey(b.prefix), "default", tag).Err())
	lim, err := limiter.New(b.rdb, &limiter.Config{Prefix: b.prefix})
	require.NoError(t, err)
	gate := lim.GateByTag(tag, "default")
	_, err = credpause.NewStore(b.jobs.Pool, nil).Pause(ctx, gate, "rate_limited_no_retry_after", "job-1")
	require.NoError(t, err)
	// The push-back lives in the credential's rate hash; the pause in keys of its own.
	b.rdb.AddHook(failKey{key: b.prefix + tag + ":rl"})

	r, out := c.do(http.MethodPost, "/console/api/credentials/default/resume", nil, nil)
	requireError(t, r, out, http.StatusServiceUnavailable, "unavailable")
	ps, err := gate.Paused(ctx)
	require.NoError(t, err)
	require.False(t, ps.Paused, "the pause ended before the push-back's clear failed")

	e := b.audit(t)
	require.Equal(t, "credential.resume", e[0].Action, "the resume done is audited")
	require.Equal(t, "alice", e[0].Operator)
	require.Equal(t, "default", e[0].Target)
	require.Equal(t, 1, e[0].Count)
	require.NotEmpty(t, e[0].Detail["push_back"], "the entry says the push-back was not cleared")
}

// TestOverview_WindowIsOnPostgresClock: the overview's hour ends now on Postgres's clock, which
// wrote the jobs' times, not on the API host's. A host 2 h ahead counted none of the hour's
// ends (its hour began an hour after Postgres's now); one 2 h behind counted the ends of the
// last three hours as the last one's.
func TestOverview_WindowIsOnPostgresClock(t *testing.T) {
	t.Parallel()
	b := setup(t)
	recent := b.jobs.Finished(t, jobs.StatusSucceeded, "")
	b.jobs.FinishedAgo(t, recent, 10*time.Minute)
	old := b.jobs.Finished(t, jobs.StatusFailed, "")
	b.jobs.FinishedAgo(t, old, 150*time.Minute)
	for _, skew := range []time.Duration{2 * time.Hour, -2 * time.Hour} {
		c, _ := b.serve(t, func(cfg *console.Config) { cfg.Now = func() time.Time { return time.Now().Add(skew) } })
		var ov console.Overview
		c.json(http.MethodGet, "/console/api/overview", nil, &ov)
		require.Equal(t, 1, ov.ByStatus[jobs.StatusSucceeded], "host clock off by %s: the end 10 minutes ago", skew)
		require.Equal(t, 0, ov.ByStatus[jobs.StatusFailed], "host clock off by %s: the end 150 minutes ago", skew)
		require.Equal(t, 2, ov.Submitted, "host clock off by %s: both created just now", skew)
	}
}

// TestOverview_NoWindowStartOfYearOne: the overview's window moves with each recomputation, so
// its JSON gives its length ("window") and no start: it said "since": "0001-01-01T00:00:00Z".
func TestOverview_NoWindowStartOfYearOne(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := b.login(t)
	res, body := c.do(http.MethodGet, "/console/api/overview", nil, nil)
	require.Equal(t, http.StatusOK, res.StatusCode, body)
	var raw map[string]json.RawMessage
	require.NoError(t, json.Unmarshal([]byte(body), &raw))
	require.Equal(t, `"1h0m0s"`, string(raw["window"]))
	require.NotContains(t, raw, "since", "body %s", body)
}

// TestTenants_RotateAudited: the console's rotate answers the new token once (working at once,
// the old one for the overlap, none with 0), audits it without the token, and refuses a bad
// overlap, an unknown tenant and a revoked one with a 4xx naming the problem.
func TestTenants_RotateAudited(t *testing.T) {
	t.Parallel()
	b := setup(t, console.Credential{Name: "default", Provider: "anthropic"})
	c := b.login(t)
	store := tenant.NewStore(b.jobs.Pool, nil)
	ctx := context.Background()
	_, old, err := store.Create(ctx, "acme", nil)
	require.NoError(t, err)

	var rot struct {
		Tenant tenant.Tenant `json:"tenant"`
		Token  string        `json:"token"`
		Ends   time.Time     `json:"previous_token_ends_at"`
		Ended  int           `json:"ended"`
	}
	start := time.Now()
	c.json(http.MethodPost, "/console/api/tenants/acme/rotate", map[string]any{}, &rot)
	require.Equal(t, "acme", rot.Tenant.Name)
	require.WithinDuration(t, start.Add(tenant.DefaultOverlap), rot.Ends, time.Minute)
	for _, tok := range []string{old, rot.Token} {
		_, err := store.Authenticate(ctx, tok)
		require.NoError(t, err)
	}
	var list struct {
		Tenants []map[string]any `json:"tenants"`
	}
	c.json(http.MethodGet, "/console/api/tenants", nil, &list)
	require.Len(t, list.Tenants, 1)
	ends, err := time.Parse(time.RFC3339Nano, list.Tenants[0]["previous_token_ends_at"].(string))
	require.NoError(t, err, "the list shows the rotation in progress")
	require.True(t, rot.Ends.Equal(ends), "%s, want %s", ends, rot.Ends)
	first := rot.Token
	c.json(http.MethodPost, "/console/api/tenants/acme/rotate", map[string]any{"overlap_seconds": 0}, &rot)
	require.Equal(t, 1, rot.Ended)
	for _, tok := range []string{old, first} {
		_, err := store.Authenticate(ctx, tok)
		require.ErrorIs(t, err, tenant.ErrRotatedOut)
	}
	_, err = store.Authenticate(ctx, rot.Token)
	require.NoError(t, err)
	list.Tenants = nil // a fresh map: json would keep the keys of the one it decodes into
	c.json(http.MethodGet, "/console/api/tenants", nil, &list)
	require.NotContains(t, list.Tenants[0], "previous_token_ends_at", "no overlap")

	for _, body := range []map[string]any{{"overlap_seconds": -1}, {"overlap_seconds": 30*24*3600 + 1}} {
		r, out := c.do(http.MethodPost, "/console/api/tenants/acme/rotate", body, nil)
		requireError(t, r, out, http.StatusBadRequest, "invalid_overlap")
	}
	r, out := c.do(http.MethodPost, "/console/api/tenants/nobody/rotate", map[string]any{}, nil)
	requireError(t, r, out, http.StatusNotFound, "not_found")
	_, err = store.Revoke(ctx, "acme")
	require.NoError(t, err)
	r, out = c.do(http.MethodPost, "/console/api/tenants/acme/rotate", map[string]any{}, nil)
	requireError(t, r, out, http.StatusConflict, "tenant_revoked")

	entries := b.audit(t)
	require.Equal(t, []string{"tenant.rotate", "tenant.rotate", "login"},
		[]string{entries[0].Action, entries[1].Action, entries[2].Action})
	require.Equal(t, "acme", entries[0].Target)
	require.Equal(t, "0s", entries[0].Detail["overlap"])
	require.Equal(t, "24h0m0s", entries[1].Detail["overlap"])
	for _, e := range entries {
		require.NotContains(t, fmt.Sprint(e.Detail), rot.Token[len(tenant.BearerTokenPrefix):])
	}
}

// TestDeadList_AnUnknownReasonIsRefused: a reason that is no dead reason (a typo, an edited
// link) matched no job and answered 200 with none: "No dead letters" while there were some.
// It is a 400 naming the reasons, as ctl's --reason (jobs.DeadReasons).
func TestDeadList_AnUnknownReasonIsRefused(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := b.login(t)
	b.jobs.Dead(t, jobstest.Opts{}, jobs.ReasonRetriesExhausted, 1)
	r, out := c.do(http.MethodGet, "/console/api/dead?reason=retries_exhaustd", nil, nil)
	requireError(t, r, out, http.StatusBadRequest, "invalid_reason")
	for _, reason := range jobs.DeadReasons() {
		require.Contains(t, out, reason, "the answer names the reasons")
	}
	var list struct {
		Jobs []struct{ ID string } `json:"jobs"`
	}
	for _, reason := range jobs.DeadReasons() {
		c.json(http.MethodGet, "/console/api/dead?reason="+reason, nil, &list)
	}
	c.json(http.MethodGet, "/console/api/dead?reason="+jobs.ReasonRetriesExhausted, nil, &list)
	require.Len(t, list.Jobs, 1)
}

// TestListFilters_UnknownOrRepeatedParameterIsRefused: a parameter the list does not take (ctl's
// --since or --limit on the dead letters, a misspelt status) was ignored: the answer listed
// every job, unfiltered, as if it were the filtered list. One given twice kept its first value.
// Each is a 400 naming the parameter.
func TestListFilters_UnknownOrRepeatedParameterIsRefused(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := b.login(t)
	b.jobs.Dead(t, jobstest.Opts{}, jobs.ReasonRetriesExhausted, 1)
	for _, tc := range []struct{ path, name string }{
		{"/console/api/dead?since=1h", "since"},
		{"/console/api/dead?limit=10&limit=20", "limit"},
		{"/console/api/dead?status=dead", "status"},
		{"/console/api/jobs?statuss=dead", "statuss"},
		{"/console/api/jobs?reason=retries_exhausted", "reason"},
		{"/console/api/jobs?status=dead&status=queued", "status"},
		{"/console/api/dead?credential=a&credential=b", "credential"},
	} {
		r, out := c.do(http.MethodGet, tc.path, nil, nil)
		requireError(t, r, out, http.StatusBadRequest, "invalid_parameter")
		require.Contains(t, out, `\"`+tc.name+`\"`, tc.path)
	}
	// What the page sends is taken.
	for _, path := range []string{"/console/api/dead?reason=retries_exhausted&credential=default&limit=10&after=",
		"/console/api/jobs?status=dead&tenant=t&credential=c&limit=5&after="} {
		r, out := c.do(http.MethodGet, path, nil, nil)
		require.Equal(t, http.StatusOK, r.StatusCode, out)
	}
}

// TestDeadActions_AMalformedIDIsNamedSo: a selected ID that is not in the form of a job ID (a
// typo, a truncated copy) is skipped as "not a job ID", by a retry and by a purge, and the rest
// of the selection is acted on. It was reported "no such job (purged?)": the operator looked for
// a purge nobody made.
func TestDeadActions_AMalformedIDIsNamedSo(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := b.login(t)
	for _, action := range []string{"retry", "purge"} {
		d := b.jobs.Dead(t, jobstest.Opts{}, jobs.ReasonRetriesExhausted, 1)
		truncated := d.ID[:35]
		var res actionResult
		c.json(http.MethodPost, "/console/api/dead/"+action, map[string]any{"ids": []string{d.ID, truncated, "job-1"}}, &res)
		require.Equal(t, []string{d.ID}, res.Done, action)
		require.Equal(t, map[string]string{truncated: "not a job ID", "job-1": "not a job ID"}, res.Skipped, action)
	}
}

// TestDeadList_Paged: the dead letters come a page at a time, most recently dead first, each
// page's "next" opening the following one ("" on the last), with the filters kept; a cursor
// the console did not make is 400 stale_page, a limit out of 1..200 400 invalid_limit. The
// console listed the 200 newest and no more: older dead letters were out of an operator's reach
// but through `ctl dead list --limit`.
func TestDeadList_Paged(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := b.login(t)
	var want []string
	for range 5 {
		want = append([]string{b.jobs.Dead(t, jobstest.Opts{}, jobs.ReasonRetriesExhausted, 1).ID}, want...)
	}
	b.jobs.Dead(t, jobstest.Opts{}, jobs.ReasonRateLimitedNoRetryAfter, 1) // filtered out

	type page struct {
		Jobs []struct {
			ID string `json:"id"`
		} `json:"jobs"`
		Next string `json:"next"`
	}
	var got []string
	var sizes []int
	after := ""
	for range 4 {
		var p page
		c.json(http.MethodGet, "/console/api/dead?reason=retries_exhausted&limit=2&after="+url.QueryEscape(after), nil, &p)
		sizes = append(sizes, len(p.Jobs))
		for _, j := range p.Jobs {
			got = append(got, j.ID)
		}
		if p.Next == "" {
			break
		}
		after = p.Next
	}
	require.Equal(t, []int{2, 2, 1}, sizes)
	require.Equal(t, want, got, "most recently dead first, each once")

	r, out := c.do(http.MethodGet, "/console/api/dead?after=bm90LWEtY3Vyc29y", nil, nil)
	requireError(t, r, out, http.StatusBadRequest, "stale_page")
	for _, limit := range []string{"0", "201", "x"} {
		r, out = c.do(http.MethodGet, "/console/api/dead?limit="+limit, nil, nil)
		requireError(t, r, out, http.StatusBadRequest, "invalid_limit")
	}
}

// TestDeadRetry_SkipsRevokedTenants: a selected dead letter of a revoked tenant is left dead and
// named in "skipped" with the reason (no retry sends it; its tenant cannot read the answer).
func TestDeadRetry_SkipsRevokedTenants(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := b.login(t)
	_, err := b.jobs.Pool.Exec(t.Context(), `INSERT INTO tenants (name, token_sha256, revoked_at) VALUES ('gone', sha256('gone'), now())`)
	require.NoError(t, err)
	gone := b.jobs.Dead(t, jobstest.Opts{Tenant: "gone"}, jobs.ReasonRetriesExhausted, 1)
	live := b.jobs.Dead(t, jobstest.Opts{}, jobs.ReasonRetriesExhausted, 1)
	// Dead after the retry began (a retry takes the jobs dead when it began): left dead, not for
	// its tenant.
	later := b.jobs.Dead(t, jobstest.Opts{}, jobs.ReasonRetriesExhausted, 1)
	_, err = b.jobs.Pool.Exec(t.Context(), `UPDATE jobs SET finished_at = now() + interval '1 hour' WHERE id = $1`, later.ID)
	require.NoError(t, err)

	var res actionResult
	c.json(http.MethodPost, "/console/api/dead/retry", map[string]any{"ids": []string{gone.ID, live.ID, later.ID}}, &res)
	require.Equal(t, []string{live.ID}, res.Done)
	require.Equal(t, map[string]string{
		gone.ID:  `its tenant "gone" is revoked: no retry sends its dead letters (cancel them)`,
		later.ID: "it died after the retry began; retry it again",
	}, res.Skipped)
	j, err := b.jobs.Store.Get(t.Context(), gone.ID)
	require.NoError(t, err)
	require.Equal(t, jobs.StatusDead, j.Status)
}

// TestJobs_ListNamesTheCredentialItIsOn: a job that failed over is listed, in the jobs list and
// the dead letters, with the credential it is on (the one that served its last attempt, that it
// died on) as current_credential, beside its own credential: a row the fallback's filter found
// named only the job's own credential, which the filter had not asked for.
func TestJobs_ListNamesTheCredentialItIsOn(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := b.login(t)
	failedOver := b.jobs.Create(t, jobstest.Opts{Fallbacks: []string{"backup"}})
	b.jobs.Attempt(t, failedOver.ID, jobs.Outcome{Status: jobs.StatusRetrying, NextCredential: true})
	b.jobs.Attempt(t, failedOver.ID, jobs.Outcome{Status: jobs.StatusDead, DeadReason: jobs.ReasonRetriesExhausted})
	stayed := b.jobs.Create(t, jobstest.Opts{Fallbacks: []string{"backup"}})

	type row struct {
		ID                string `json:"id"`
		Credential        string `json:"credential"`
		CurrentCredential string `json:"current_credential"`
	}
	var page struct {
		Jobs []row `json:"jobs"`
	}
	for _, path := range []string{"/console/api/jobs?credential=backup", "/console/api/dead?credential=backup",
		"/console/api/dead?credential=default"} {
		c.json(http.MethodGet, path, nil, &page)
		require.Equal(t, []row{{failedOver.ID, "default", "backup"}}, page.Jobs, path)
	}
	c.json(http.MethodGet, "/console/api/jobs?credential=default", nil, &page)
	require.Equal(t, []row{{stayed.ID, "default", "default"}, {failedOver.ID, "default", "backup"}}, page.Jobs,
		"a job that never failed over is on its own credential")
	var detail struct {
		Job row `json:"job"`
	}
	c.json(http.MethodGet, "/console/api/jobs/"+failedOver.ID, nil, &detail)
	require.Equal(t, row{failedOver.ID, "default", "backup"}, detail.Job, "the job page too")
	attempts, err := b.jobs.Store.Attempts(t.Context(), failedOver.ID)
	require.NoError(t, err)
	require.Equal(t, "backup", attempts[len(attempts)-1].Credential, "the credential of its last attempt")
}
