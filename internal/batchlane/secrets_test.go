package batchlane_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/batchlane"
	"github.com/llmq/llmq/internal/jobs"
	"github.com/llmq/llmq/internal/llmsim"
	"github.com/llmq/llmq/internal/retrypolicy"
)

// secretKey is the credential's API key in these tests, which the provider echoes.
const secretKey = "sk-ant-api03-Zq7vXw2LmN9pR4tK8sJ1yH6gF3dC5bA0eU-QoIxWcVbNmLkJh"

// echoMarker, in a job's text, comes back in the simulator's answer ("llmsim reply to: ..."):
// the front below turns it into the key there.
const echoMarker = "ECHOTHEKEYHERE"

// keyEchoingFront is the simulator behind a front that makes the provider echo the API key:
// in each batch's results (the answer of a job whose text holds echoMarker, and, JSON-escaped,
// the message of a refused request), and, when refuse is not 0, in the error answer (status refuse) to every
// batch creation, in the forms a provider or a proxy uses (as sent, upper case, base64).
func keyEchoingFront(t *testing.T, b *testBundle, refuse int) batchlane.Client {
	t.Helper()
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if refuse != 0 && r.Method == http.MethodPost && (r.URL.Path == "/v1/messages/batches" || r.URL.Path == "/v1/batches") {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(refuse)
			_, _ = fmt.Fprintf(w, `{"type":"error","error":{"type":"authentication_error","message":"invalid x-api-key %s (%s; %s)"}}`,
				secretKey, strings.ToUpper(secretKey), base64.StdEncoding.EncodeToString([]byte(secretKey)))
			return
		}
		if !strings.HasSuffix(r.URL.Path, "/results") && !strings.HasSuffix(r.URL.Path, "/content") {
			b.sim.ServeHTTP(w, r)
			return
		}
		rec := httptest.NewRecorder()
		b.sim.ServeHTTP(rec, r)
		body := bytes.ReplaceAll(rec.Body.Bytes(), []byte(echoMarker), []byte(secretKey))
		// The refused request's message holds the key JSON-escaped (past a byte mask of the
		// raw file) and a NUL (which Postgres refuses in jsonb).
		escaped := strings.ReplaceAll(secretKey, "-", `\u002d`)
		body = bytes.ReplaceAll(body, []byte("request contains the llmsim bad-request marker"), []byte("key "+escaped+`\u0000 may not do this`))
		maps.Copy(w.Header(), rec.Header())
		w.Header().Del("Content-Length")
		w.WriteHeader(rec.Code)
		_, _ = w.Write(body)
	}))
	t.Cleanup(ts.Close)
	client, err := batchlane.NewClient(b.provider, ts.URL, secretKey, ts.Client())
	require.NoError(t, err)
	return client
}

// requireNoKeyStored fails when any row of any table holds the key, in any letter case.
func requireNoKeyStored(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	ctx := context.Background()
	rows, err := pool.Query(ctx, `SELECT tablename FROM pg_tables WHERE schemaname = current_schema()`)
	require.NoError(t, err)
	tables, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.NotEmpty(t, tables)
	for _, table := range tables {
		var n int
		q := `SELECT count(*) FROM ` + pgx.Identifier{table}.Sanitize() + ` t WHERE strpos(lower(t::text), lower($1)) > 0`
		require.NoError(t, pool.QueryRow(ctx, q, secretKey).Scan(&n))
		require.Zero(t, n, "table %s stores the API key", table)
	}
}

// TestBatcher_ProviderTextLosesTheKey: what a provider's batch API says is untrusted, as the
// online lane's (internal/llm): the API key it echoes reaches no job's result, error or attempt,
// no error a pass returns (which the worker logs), whether the batch is refused (a bad key:
// 401) or the provider fails (500), or a request's answer or error message echoes it. Before,
// the batch lane stored and logged the provider's text as it came.
func TestBatcher_ProviderTextLosesTheKey(t *testing.T) {
	t.Parallel()
	for _, provider := range []string{"anthropic", "openai"} {
		t.Run(provider+"/Results", func(t *testing.T) {
			t.Parallel()
			b := setup(t, setupOpts{provider: provider})
			bt := b.batcher(keyEchoingFront(t, b, 0))
			ok := b.submit(t, echoMarker, 0, 0)
			bad := b.submit(t, llmsim.DefaultBadRequestMarker, 0, 0)
			b.clock.Advance(fill)
			once(t, bt)
			b.clock.Advance(2 * time.Hour)
			once(t, bt)

			got := b.get(t, ok.ID)
			require.Equal(t, jobs.StatusSucceeded, got.Status, "the answer is kept, the key masked in it")
			require.Contains(t, string(got.Result), "llmsim reply to: ")
			require.NotContains(t, string(got.Result), secretKey)
			got = b.get(t, bad.ID)
			require.Equal(t, jobs.StatusFailed, got.Status)
			require.Contains(t, got.LastError.Message, "may not do this")
			require.NotContains(t, got.LastError.Message, secretKey)
			requireNoKeyStored(t, b.pool)
		})

		t.Run(provider+"/Refused", func(t *testing.T) {
			t.Parallel()
			b := setup(t, setupOpts{provider: provider})
			j := b.submit(t, "x", 0, 0)
			b.clock.Advance(fill)
			once(t, b.batcher(keyEchoingFront(t, b, http.StatusUnauthorized)))
			got := b.get(t, j.ID)
			require.Equal(t, "batch_refused", got.LastError.Type)
			require.Contains(t, got.LastError.Message, "invalid x-api-key")
			require.NotContains(t, strings.ToLower(got.LastError.Message), strings.ToLower(secretKey))
			require.NotContains(t, got.LastError.Message, base64.StdEncoding.EncodeToString([]byte(secretKey)))
			requireNoKeyStored(t, b.pool)
		})

		t.Run(provider+"/ServerError", func(t *testing.T) {
			t.Parallel()
			b := setup(t, setupOpts{provider: provider})
			b.submit(t, "x", 0, 0)
			b.clock.Advance(fill)
			err := b.batcher(keyEchoingFront(t, b, http.StatusInternalServerError)).Once(context.Background())
			require.ErrorContains(t, err, "invalid x-api-key", "the pass fails, and its error is logged")
			require.NotContains(t, strings.ToLower(err.Error()), strings.ToLower(secretKey))
			require.NotContains(t, err.Error(), base64.StdEncoding.EncodeToString([]byte(secretKey)))
			requireNoKeyStored(t, b.pool)
		})
	}
}

// TestClient_ErrorBodyCleaned: a StatusError's body is the provider's text made safe: no key
// (not even the start of one that the cut split), no NUL or escape sequence (Postgres refuses a
// NUL; a terminal must not get escapes), at most 512 bytes and the cut mark.
func TestClient_ErrorBodyCleaned(t *testing.T) {
	t.Parallel()
	// A second key straddles the 512th byte: a cut before the redaction kept its start.
	head := "key " + secretKey + "\x00\x1b[31m "
	body := head + strings.Repeat("a", 512-20-len(head)) + secretKey + strings.Repeat("b", 1000)
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.WriteHeader(http.StatusForbidden)
		_, _ = io.WriteString(w, body)
	}))
	t.Cleanup(ts.Close)
	for _, provider := range []string{"anthropic", "openai"} {
		client, err := batchlane.NewClient(provider, ts.URL, secretKey, ts.Client())
		require.NoError(t, err)
		_, err = client.Poll(context.Background(), "batch_1")
		var se *batchlane.StatusError
		require.ErrorAs(t, err, &se)
		require.Equal(t, http.StatusForbidden, se.Status)
		require.True(t, strings.HasPrefix(se.Body, "key [redacted]"), se.Body)
		require.NotContains(t, se.Body, secretKey[:8], "no part of the key")
		require.NotContains(t, se.Body, "\x00")
		require.NotContains(t, se.Body, "\x1b")
		require.LessOrEqual(t, len(se.Body), 512+len("…"))
	}
}

// TestClient_RedirectNotFollowed: a batch API call answered with a redirect is not followed, for
// either provider and method: following it would send the key to wherever it points (Go's
// client drops Authorization on a redirect to another host, not Anthropic's x-api-key). The 3xx
// is the call's StatusError, as in the online lane (internal/llm). Before, the batch client
// followed it, the key with it.
func TestClient_RedirectNotFollowed(t *testing.T) {
	t.Parallel()
	var seen atomic.Int32
	elsewhere := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.Contains(r.Header.Get("x-api-key")+r.Header.Get("Authorization"), secretKey) {
			seen.Add(1)
		}
		w.WriteHeader(http.StatusOK)
		_, _ = io.WriteString(w, `{"id":"file_1","processing_status":"in_progress","status":"in_progress"}`)
	}))
	t.Cleanup(elsewhere.Close)
	front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		http.Redirect(w, r, elsewhere.URL+r.URL.Path, http.StatusTemporaryRedirect)
	}))
	t.Cleanup(front.Close)
	for _, provider := range []string{"anthropic", "openai"} {
		client, err := batchlane.NewClient(provider, front.URL, secretKey, front.Client())
		require.NoError(t, err)
		_, err = client.Submit(context.Background(), "ref", []batchlane.Request{{CustomID: "a", Body: []byte(`{"model":"m"}`)}}, noRecord)
		require.Zero(t, seen.Load(), "%s: the key went to the redirect's target", provider)
		var se *batchlane.StatusError
		require.ErrorAs(t, err, &se, provider)
		require.Equal(t, http.StatusTemporaryRedirect, se.Status)
		_, err = client.Poll(context.Background(), "batch_1")
		require.Zero(t, seen.Load(), "%s: the key went to the redirect's target", provider)
		require.ErrorAs(t, err, &se, provider)
		require.Equal(t, http.StatusTemporaryRedirect, se.Status)
	}
}

// TestClient_SpendCapCodeAfterTheCutIsRead: an error answer's reason (a spend-cap code) is read
// from the whole answer, as the online lane reads it, not from the 512 bytes kept in Body: a
// long message before it (a proxy's, or one quoting the request) hid it, and a spend cap
// answered with a status that says nothing by itself (402, or a 429 with Retry-After) was not
// classified as one, so the credential was not paused.
func TestClient_SpendCapCodeAfterTheCutIsRead(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("you exceeded your current quota; ", 30) // ~1 KB before the code
	bodies := map[string]string{
		"openai":    `{"error":{"message":"` + long + `","type":"insufficient_quota","param":null,"code":"insufficient_quota"}}`,
		"anthropic": `{"type":"error","error":{"type":"rate_limit_error","message":"` + long + `","details":{"error_code":"enforced_spend_limit_reached"}}}`,
	}
	for provider, body := range bodies {
		ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.Copy(io.Discard, r.Body)
			w.Header().Set("Retry-After", "30")
			w.WriteHeader(http.StatusTooManyRequests)
			_, _ = io.WriteString(w, body)
		}))
		t.Cleanup(ts.Close)
		client, err := batchlane.NewClient(provider, ts.URL, secretKey, ts.Client())
		require.NoError(t, err)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		_, err = client.Submit(ctx, "ref", []batchlane.Request{{CustomID: "a", Body: []byte(`{"model":"m"}`)}}, noRecord)
		cancel()
		var se *batchlane.StatusError
		require.ErrorAs(t, err, &se, provider)
		require.LessOrEqual(t, len(se.Body), 512+len("…"), provider)
		require.Equal(t, retrypolicy.ClassSpendCap, retrypolicy.Classify(err, time.Now()).Class, "%s: %s", provider, se.ErrorType())
	}
}
