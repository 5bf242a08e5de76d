package api

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/pgtest"
)

// TestSubmit_ReplayOutlivesAConfigChange: a replay (the same Idempotency-Key and body) answers
// 200 with the key's job even when the replica answering it would refuse the body as a new
// submit, because its configuration changed since (a rolling deploy that turns a credential's
// batch lane off, or drops a fallback credential). A 4xx would tell the client, whose first
// answer was lost, that nothing was stored, while its job exists and is paid for. A body that
// differs, or a key never used, still gets the refusal.
func TestSubmit_ReplayOutlivesAConfigChange(t *testing.T) {
	t.Parallel()
	before := setup(t, setupOpts{credentials: []string{"default", "backup"},
		batchWindows: map[string]time.Duration{"default": time.Hour}})
	after := setup(t, setupOpts{dbURL: before.dbURL, credentials: []string{"default"}})

	for _, tc := range []struct {
		name, body, other, refusal string
	}{
		{"BatchLaneTurnedOff", `{"lane":"batch","request":{"model":"m","max_tokens":5}}`,
			`{"lane":"batch","request":{"model":"m","max_tokens":6}}`, "batch_unavailable"},
		{"FallbackRemoved", `{"fallbacks":["backup"],"request":{"model":"m","max_tokens":5}}`,
			`{"fallbacks":["backup"],"request":{"model":"m","max_tokens":6}}`, "unknown_credential"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			key := map[string]string{"Idempotency-Key": "config-" + tc.name}
			first := before.do(t, http.MethodPost, "/v1/jobs", tc.body, key)
			require.Equal(t, http.StatusAccepted, first.status, "%v", first.body)
			id := first.body["id"].(string)

			again := after.do(t, http.MethodPost, "/v1/jobs", tc.body, key)
			require.Equal(t, http.StatusOK, again.status, "a replay answers its job: %v", again.body)
			require.Equal(t, id, again.body["id"])
			require.Equal(t, "true", again.header.Get("Idempotent-Replayed"))
			require.Equal(t, "/v1/jobs/"+id, again.header.Get("Location"))

			// Another body with the key, or the body under a new key: the refusal.
			for _, r := range []response{
				after.do(t, http.MethodPost, "/v1/jobs", tc.other, key),
				after.do(t, http.MethodPost, "/v1/jobs", tc.body, map[string]string{"Idempotency-Key": "new-" + tc.name}),
				after.do(t, http.MethodPost, "/v1/jobs", tc.body, nil),
			} {
				require.Equal(t, http.StatusBadRequest, r.status, "%v", r.body)
				require.Equal(t, tc.refusal, r.body["error"].(map[string]any)["type"])
			}
		})
	}
	var n int
	require.NoError(t, before.pool.QueryRow(t.Context(), `SELECT count(*) FROM jobs`).Scan(&n))
	require.Equal(t, 2, n, "one job per key, nothing stored for a refusal")
}

// TestSubmit_ReplayWaitsForAnUncommittedFirstSubmit: the key's first submit, on a replica that
// accepts the body, has claimed the key but not committed yet (its job's insert is held on the
// wire) when the client, whose answer is late, sends the body again to a replica that refuses it
// as a new job. The second answer must wait for the first's commit and replay its job, as a
// replay of an accepted body does: a refusal, read before the commit, would tell the client that
// nothing was stored while the job is about to run.
func TestSubmit_ReplayWaitsForAnUncommittedFirstSubmit(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.URL(t)
	proxy, proxyURL := pgtest.NewProxy(t, dbURL)
	before := setup(t, setupOpts{dbURL: proxyURL, credentials: []string{"default", "backup"}, noListener: true})
	after := setup(t, setupOpts{dbURL: dbURL, credentials: []string{"default"}, noListener: true})
	body := `{"fallbacks":["backup"],"request":{"model":"m","max_tokens":5}}`
	key := map[string]string{"Idempotency-Key": "uncommitted"}

	insert := proxy.HoldStatement("INSERT INTO jobs (")
	defer insert.Release()
	first, second := make(chan response, 1), make(chan response, 1)
	go func() { first <- post(t, before.url, body, key) }()
	select {
	case <-insert.Reached():
	case r := <-first:
		t.Fatalf("the first submit was not held: %d %v", r.status, r.body)
	case <-time.After(30 * time.Second):
		t.Fatal("the first submit's insert was not reached within 30s")
	}
	go func() { second <- post(t, after.url, body, key) }()

	// The second submit either answers at once (the refusal) or waits on the first's claim.
	var early *response
	deadline := time.Now().Add(30 * time.Second)
	for early == nil {
		select {
		case r := <-second:
			early = &r
			continue
		default:
		}
		var waiting int
		require.NoError(t, after.pool.QueryRow(t.Context(), `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE '%idempotency_keys%'`).Scan(&waiting))
		if waiting > 0 {
			break
		}
		require.True(t, time.Now().Before(deadline), "the second submit neither answered nor waited within 30s")
		time.Sleep(time.Millisecond)
	}
	insert.Release()
	var f response
	select {
	case f = <-first:
	case <-time.After(30 * time.Second):
		t.Fatal("the first submit did not answer within 30s of its insert's release")
	}
	require.Equal(t, http.StatusAccepted, f.status, "%v", f.body)
	s := early
	if s == nil {
		select {
		case r := <-second:
			s = &r
		case <-time.After(30 * time.Second):
			t.Fatal("the second submit did not answer within 30s of the first's commit")
		}
	}
	require.Equal(t, http.StatusOK, s.status, "the second submit replays the first's job: %v", s.body)
	require.Equal(t, f.body["id"], s.body["id"])
	require.Equal(t, "true", s.header.Get("Idempotent-Replayed"))
}

// post is a POST /v1/jobs for a goroutine: a failure is an answer of status 0 (with the error in
// its body), not a FailNow outside the test's goroutine.
func post(t *testing.T, base, body string, header map[string]string) response {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	fail := func(err error) response { return response{body: map[string]any{"error": err.Error()}} }
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/jobs", strings.NewReader(body))
	if err != nil {
		return fail(err)
	}
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fail(err)
	}
	defer resp.Body.Close()
	out := response{status: resp.StatusCode, header: resp.Header}
	if err := json.NewDecoder(resp.Body).Decode(&out.body); err != nil {
		return fail(err)
	}
	return out
}
