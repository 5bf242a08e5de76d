package api

import (
	"bufio"
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
)

// TestEvents_FullCapAnswersEveryCallerAsUnderIt: with the replica's stream places full
// (api.max_streams), a stream's caller is still authenticated first: a made-up token, a revoked
// tenant's or a signed URL's bad token gets its own refusal (401, 403), as under the cap, and
// holds no place. An authenticated caller gets the cap's 503, whatever the job (its own, another
// tenant's, none): the job is not read over the cap, and the answer tells nothing of it.
func TestEvents_FullCapAnswersEveryCallerAsUnderIt(t *testing.T) {
	t.Parallel()
	signer, err := NewStreamSigner(streamKey, 10*time.Minute, time.Now)
	require.NoError(t, err)
	b := setup(t, setupOpts{signer: signer, noAnonymous: true, tenantTTL: time.Millisecond, maxServerStreams: 1})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	acme, other, gone := b.newTenant(t, "acme"), b.newTenant(t, "other"), b.newTenant(t, "gone")
	mine, theirs := b.create(t, "acme"), b.create(t, "other")
	_, err = b.tenants.Revoke(ctx, "gone")
	require.NoError(t, err)

	// acme's stream holds the only place.
	streamCtx, cancelStream := context.WithTimeout(ctx, 30*time.Second)
	req, err := http.NewRequestWithContext(streamCtx, http.MethodGet, b.url+"/v1/jobs/"+mine.ID+"/events", nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", acme["Authorization"])
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	held := &stream{resp: resp, lines: bufio.NewScanner(resp.Body), cancel: cancelStream}
	t.Cleanup(held.close)
	require.Equal(t, "queued", held.nextEvent(t).event)

	for _, c := range []struct {
		name, path string
		header     map[string]string
		status     int
		typ        string
	}{
		{"no token", "/v1/jobs/" + mine.ID + "/events", nil, http.StatusUnauthorized, "unauthorized"},
		{"made-up token", "/v1/jobs/" + mine.ID + "/events", map[string]string{"Authorization": "Bearer llmq_" + uuid.NewString()}, http.StatusUnauthorized, ""},
		{"revoked tenant", "/v1/jobs/" + mine.ID + "/events", gone, http.StatusForbidden, ""},
		{"bad signed token", "/v1/jobs/" + mine.ID + "/events?token=nonsense", nil, http.StatusUnauthorized, ""},
		{"own job", "/v1/jobs/" + mine.ID + "/events", acme, http.StatusServiceUnavailable, "overloaded"},
		{"another tenant's job", "/v1/jobs/" + mine.ID + "/events", other, http.StatusServiceUnavailable, "overloaded"},
		{"no such job", "/v1/jobs/" + uuid.NewString() + "/events", other, http.StatusServiceUnavailable, "overloaded"},
		{"signed URL", signer.URL(theirs.ID), nil, http.StatusServiceUnavailable, "overloaded"},
	} {
		r := b.do(t, http.MethodGet, c.path, "", c.header)
		require.Equal(t, c.status, r.status, "%s: %v", c.name, r.body)
		if c.typ != "" {
			require.Equal(t, c.typ, r.body["error"].(map[string]any)["type"], c.name)
		}
	}

	// The place free, each answers as ever: another tenant's job, or none, is 404.
	held.close()
	for _, path := range []string{"/v1/jobs/" + mine.ID + "/events", "/v1/jobs/" + uuid.NewString() + "/events"} {
		for {
			r := b.do(t, http.MethodGet, path, "", other)
			if r.status == http.StatusNotFound {
				break
			}
			require.Equal(t, http.StatusServiceUnavailable, r.status, "%s: %v", path, r.body)
			select {
			case <-ctx.Done():
				t.Fatalf("%s: the held stream's place was not freed", path)
			case <-time.After(10 * time.Millisecond):
			}
		}
	}
}
