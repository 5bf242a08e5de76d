package e2e_test

import (
	"context"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/llmsim"
	"github.com/llmq/llmq/internal/redistest"
)

func TestSubmit_Succeeds(t *testing.T) {
	t.Parallel()
	redistest.OnEach(t, func(t *testing.T, r redistest.Target) {
		b := setup(t, setupOpts{redisURL: r.URL})

		id := b.submit(t, anthropicBody("hello there"))
		job := b.waitTerminal(t, id)

		require.Equal(t, "succeeded", job["status"])
		require.EqualValues(t, 1, job["attempts"])
		result := job["result"].(map[string]any)
		require.Equal(t, "message", result["type"])
		content := result["content"].([]any)[0].(map[string]any)
		require.Contains(t, content["text"], "hello there")
		require.NotNil(t, job["usage"])
		require.Equal(t, 1, b.sim.Stats().Requests)
	})
}

func TestSubmit_OpenAICredential(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})

	id := b.submit(t, `{"credential":"oai","request":{"model":"gpt-test","messages":[{"role":"user","content":"hi"}]}}`)
	job := b.waitTerminal(t, id)

	require.Equal(t, "succeeded", job["status"])
	require.Equal(t, "chat.completion", job["result"].(map[string]any)["object"])
}

func TestSubmit_ProviderBadRequestFailsAfterOneCall(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})

	id := b.submit(t, anthropicBody("please "+llmsim.DefaultBadRequestMarker))
	job := b.waitTerminal(t, id)

	require.Equal(t, "failed", job["status"])
	require.EqualValues(t, 1, job["attempts"])
	lastErr := job["last_error"].(map[string]any)
	require.EqualValues(t, 400, lastErr["status"])
	require.Equal(t, "permanent", lastErr["class"])
	require.Equal(t, 1, b.sim.Stats().Requests)
}

func TestSubmit_TransientErrorsRetried(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{sim: llmsim.Config{Faults: llmsim.Faults{FailNext: 2, FailNextStatus: 503}}})

	id := b.submit(t, anthropicBody("flaky"))
	job := b.waitTerminal(t, id)

	require.Equal(t, "succeeded", job["status"])
	require.EqualValues(t, 3, job["attempts"])
	st := b.sim.Stats()
	require.Equal(t, 3, st.Requests)
	require.Equal(t, 2, st.ByStatus[503])
	require.Equal(t, 3, b.countRows(t, "job_attempts"))
}

func TestSubmit_RetriesExhaustedIsDead(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{sim: llmsim.Config{Faults: llmsim.Faults{FailNext: 100, FailNextStatus: 500}}})

	id := b.submit(t, `{"max_attempts":2,"request":{"model":"m","max_tokens":5,"messages":[{"role":"user","content":"x"}]}}`)
	job := b.waitTerminal(t, id)

	require.Equal(t, "dead", job["status"])
	require.Equal(t, "retries_exhausted", job["dead_reason"])
	require.Equal(t, 2, b.sim.Stats().Requests)
}

func TestSubmit_SpendCapIsDeadAfterOneCall(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{sim: llmsim.Config{Faults: llmsim.Faults{SpendCap: true}}})

	id := b.submit(t, anthropicBody("costly"))
	job := b.waitTerminal(t, id)

	require.Equal(t, "dead", job["status"])
	require.Equal(t, "rate_limited_no_retry_after", job["dead_reason"])
	require.Equal(t, 1, b.sim.Stats().Requests)
}

func TestSubmit_Idempotency(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	key := map[string]string{"Idempotency-Key": "order-42"}

	first := b.do(t, http.MethodPost, "/v1/jobs", `{"request":{"model":"m","max_tokens":5,"messages":[{"role":"user","content":"a"}]}}`, key)
	require.Equal(t, http.StatusAccepted, first.status)
	require.Equal(t, "order-42", first.body["idempotency_key"])

	t.Run("SameBodyReplays", func(t *testing.T) {
		// Same document, other key order and spacing.
		again := b.do(t, http.MethodPost, "/v1/jobs", `{ "request" : {"messages":[{"content":"a","role":"user"}],"max_tokens":5, "model":"m"} }`, key)
		require.Equal(t, http.StatusOK, again.status)
		require.Equal(t, "true", again.header.Get("Idempotent-Replayed"))
		require.Equal(t, first.body["id"], again.body["id"])
	})
	t.Run("DifferentBodyIs422", func(t *testing.T) {
		other := b.do(t, http.MethodPost, "/v1/jobs", `{"request":{"model":"m","max_tokens":5,"messages":[{"role":"user","content":"b"}]}}`, key)
		require.Equal(t, http.StatusUnprocessableEntity, other.status)
		require.Equal(t, "idempotency_key_reused", other.body["error"].(map[string]any)["type"])
	})
	b.waitTerminal(t, first.body["id"].(string))
	require.Equal(t, 1, b.countRows(t, "jobs"))
	require.Equal(t, 1, b.sim.Stats().Requests)
}

// 100 submits of one Idempotency-Key at once make one job, and every answer names it. The
// tenant's keyed submits pass its places (api.Config.MaxKeyedSubmitsPerTenant: 3 on the test's
// pool of 6) a few at a time, and the last of them waits for the 97 before it: about 3 s under
// -race on an idle machine, past the API's default 5 s wait (429 too_many_submits, a refusal,
// not a second job) on a loaded one. The API here waits up to 15 s, still less than a request's
// requestTimeout, so that a refusal is answered (and shown) rather than the request timing out.
func TestSubmit_ConcurrentSameKeyMakesOneJob(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{storeWait: 15 * time.Second})
	key := map[string]string{"Idempotency-Key": "burst-1"}
	body := anthropicBody("once only")

	const n = 100
	answers := make([]response, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	start := time.Now()
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			answers[i], errs[i] = b.tryDo(http.MethodPost, "/v1/jobs", body, key)
		}()
	}
	wg.Wait()
	t.Logf("%d submits answered in %s", n, time.Since(start))

	id := func(r response) string { s, _ := r.body["id"].(string); return s }
	accepted := 0
	for i, r := range answers {
		require.NoError(t, errs[i])
		require.Contains(t, []int{http.StatusAccepted, http.StatusOK}, r.status, "answer %d: %v", i, r.body)
		require.NotEmpty(t, id(r))
		require.Equal(t, id(answers[0]), id(r), "answer %d", i)
		if r.status == http.StatusAccepted {
			accepted++
		}
	}
	require.Equal(t, 1, accepted)
	job := b.waitTerminal(t, id(answers[0]))
	require.Equal(t, "succeeded", job["status"])
	require.Equal(t, 1, b.countRows(t, "jobs"))
	require.Equal(t, 1, b.sim.Stats().Requests)
}

func TestSubmit_BadInputIs4xxAndStoresNothing(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{noWorker: true})

	cases := []struct {
		name, body, typ string
		header          map[string]string
		status          int
	}{
		{"MalformedJSON", `{"request":`, "invalid_json", nil, 400},
		{"NotAnObject", `[1,2]`, "invalid_body", nil, 400},
		{"MissingRequest", `{"credential":"default"}`, "missing_request", nil, 400},
		{"RequestNotObject", `{"request":"hi"}`, "invalid_request", nil, 400},
		{"UnknownCredential", `{"credential":"nope","request":{"model":"m"}}`, "unknown_credential", nil, 400},
		{"UnknownField", `{"request":{"model":"m"},"colour":"red"}`, "unknown_field", nil, 400},
		{"BadTimeout", `{"request":{"model":"m"},"timeout":"soon"}`, "invalid_timeout", nil, 400},
		{"BadMaxAttempts", `{"request":{"model":"m"},"max_attempts":0}`, "invalid_max_attempts", nil, 400},
		{"BadMetadata", `{"request":{"model":"m"},"metadata":[1]}`, "invalid_metadata", nil, 400},
		{"BadIdempotencyKey", `{"request":{"model":"m"}}`, "invalid_idempotency_key", map[string]string{"Idempotency-Key": "has space"}, 400},
		{"TooLarge", `{"request":{"model":"` + strings.Repeat("x", 70000) + `"}}`, "body_too_large", nil, 413},
		{"BearerNotYet", `{"request":{"model":"m"}}`, "unauthorized", map[string]string{"Authorization": "Bearer x"}, 401},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := b.do(t, http.MethodPost, "/v1/jobs", tc.body, tc.header)
			require.Equal(t, tc.status, r.status, "body: %v", r.body)
			e := r.body["error"].(map[string]any)
			require.Equal(t, tc.typ, e["type"])
			require.NotEmpty(t, e["message"])
		})
	}
	require.Equal(t, 0, b.countRows(t, "jobs"))
}

func TestAPI_Routes(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{noWorker: true})

	require.Equal(t, http.StatusNotFound, b.do(t, http.MethodGet, "/v1/jobs/not-a-uuid", "", nil).status)
	require.Equal(t, http.StatusNotFound, b.do(t, http.MethodGet, "/v1/jobs/0190e6f3-0000-7000-8000-000000000000", "", nil).status)
	require.Equal(t, http.StatusMethodNotAllowed, b.do(t, http.MethodPut, "/v1/jobs", "", nil).status)
	require.Equal(t, http.StatusOK, b.do(t, http.MethodGet, "/healthz", "", nil).status)
	ready := b.do(t, http.MethodGet, "/readyz", "", nil)
	require.Equal(t, http.StatusOK, ready.status)
	require.Equal(t, "ok", ready.body["postgres"])
	require.Equal(t, "ok", ready.body["redis"])
}

func TestSweeper_RedisFlushLosesNoJob(t *testing.T) {
	t.Parallel()
	redistest.OnEach(t, func(t *testing.T, r redistest.Target) {
		redisURL := r.Private(t) // private: FLUSHALL here touches no other test
		b := setup(t, setupOpts{redisURL: redisURL, noWorker: true})

		const n = 50
		ids := make([]string, n)
		for i := range n {
			ids[i] = b.submit(t, anthropicBody("survive the flush"))
		}
		rdb := redistest.ClientOf(t, redisURL)
		ctx, cancel := context.WithTimeout(b.ctx, 30*time.Second)
		defer cancel()
		require.NoError(t, redistest.FlushAll(ctx, rdb)) // every master of a cluster
		keys, err := rdb.DBSize(ctx).Result()            // a cluster client sums its masters
		require.NoError(t, err)
		require.Zero(t, keys, "the flush removed every queued task")

		b.startWorker(t)
		for _, id := range ids {
			require.Equal(t, "succeeded", b.waitTerminal(t, id)["status"])
		}
		require.Equal(t, n, b.sim.Stats().Requests)
	})
}
