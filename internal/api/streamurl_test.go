package api

import (
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/clocktest"
)

var streamKey = []byte(strings.Repeat("0123456789abcdef", 2))

func TestStreamURL(t *testing.T) {
	t.Parallel()
	clock := clocktest.New(time.Now())
	signer, err := NewStreamSigner(streamKey, 10*time.Minute, clock.Now)
	require.NoError(t, err)
	// No anonymous access: a stream URL must open its stream by itself.
	b := setup(t, setupOpts{signer: signer, noAnonymous: true})
	token := b.newTenant(t, "acme")
	submitted := b.do(t, http.MethodPost, "/v1/jobs", `{"request":{"model":"m"}}`, token)
	require.Equal(t, http.StatusAccepted, submitted.status)
	id := submitted.body["id"].(string)
	eventsURL := submitted.body["events_url"].(string)
	require.True(t, strings.HasPrefix(eventsURL, "/v1/jobs/"+id+"/events?token="), eventsURL)
	require.Equal(t, eventsURL, b.do(t, http.MethodGet, "/v1/jobs/"+id, "", token).body["events_url"],
		"GET answers a URL too (the same while the clock stands still)")
	other := b.do(t, http.MethodPost, "/v1/jobs", `{"request":{"model":"m"}}`, token).body
	otherID := other["id"].(string)

	t.Run("Valid", func(t *testing.T) {
		t.Parallel()
		s := openStreamPath(t, b.url, eventsURL, "")
		require.Equal(t, "*", s.resp.Header.Get("Access-Control-Allow-Origin"))
		require.Equal(t, "queued/1", names([]sseFrame{s.nextEvent(t)})[0])
	})
	t.Run("AnotherReplica", func(t *testing.T) {
		t.Parallel()
		replicaSigner, err := NewStreamSigner(streamKey, time.Minute, clock.Now)
		require.NoError(t, err)
		replica := setup(t, setupOpts{dbURL: b.dbURL, signer: replicaSigner, noAnonymous: true})
		s := openStreamPath(t, replica.url, eventsURL, "")
		require.Equal(t, "queued/1", names([]sseFrame{s.nextEvent(t)})[0])
	})
	t.Run("UpperCaseID", func(t *testing.T) {
		// The job's path takes its ID in either case, as a poll's does: the token is the ID's,
		// not its spelling's.
		t.Parallel()
		s := openStreamPath(t, b.url, strings.Replace(eventsURL, id, strings.ToUpper(id), 1), "")
		require.Equal(t, "queued/1", names([]sseFrame{s.nextEvent(t)})[0])
	})
	t.Run("OnlyTheStream", func(t *testing.T) {
		t.Parallel()
		_, query, _ := strings.Cut(eventsURL, "?")
		r := b.do(t, http.MethodGet, "/v1/jobs/"+id+"?"+query, "", nil)
		require.Equal(t, http.StatusUnauthorized, r.status)
	})
	refused := func(t *testing.T, base, path, want string) {
		t.Helper()
		r := do(t, base, http.MethodGet, path, "", nil)
		require.Equal(t, http.StatusUnauthorized, r.status)
		require.Equal(t, want, r.body["error"].(map[string]any)["type"])
		// A 401 names how to authenticate (RFC 9110): a bearer token opens the stream too.
		require.Equal(t, `Bearer realm="llmq", error="invalid_token"`, r.header.Get("WWW-Authenticate"))
	}
	t.Run("OtherJob", func(t *testing.T) {
		t.Parallel()
		refused(t, b.url, strings.Replace(eventsURL, id, otherID, 1), "invalid_stream_token")
	})
	t.Run("Tampered", func(t *testing.T) {
		t.Parallel()
		u, err := url.Parse(eventsURL)
		require.NoError(t, err)
		tok := u.Query().Get("token")
		exp, sig, _ := strings.Cut(tok, ".")
		n, err := strconv.ParseInt(exp, 10, 64)
		require.NoError(t, err)
		flipped := []byte(sig)
		flipped[3] ^= 1
		for name, bad := range map[string]string{
			"LaterExpiry": strconv.FormatInt(n+3600, 10) + "." + sig,
			"Signature":   exp + "." + string(flipped),
			"NoSignature": exp,
			"Empty":       "",
			"OtherKey":    mustSigner(t, strings.Repeat("x", 32), clock).URL(id),
		} {
			path := u.Path + "?token=" + url.QueryEscape(bad)
			if strings.HasPrefix(bad, "/") {
				path = bad
			}
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				refused(t, b.url, path, "invalid_stream_token")
			})
		}
	})
	t.Run("RepeatedToken", func(t *testing.T) {
		// A token given twice is refused, naming the repeat, whatever the values: the first was
		// read and the others ignored, so a URL appended to opened the stream by what it began with.
		t.Parallel()
		_, query, _ := strings.Cut(eventsURL, "?")
		for name, extra := range map[string]string{"Same": query, "Other": "token=garbage"} {
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				r := do(t, b.url, http.MethodGet, eventsURL+"&"+extra, "", nil)
				require.Equal(t, http.StatusUnauthorized, r.status)
				e := r.body["error"].(map[string]any)
				require.Equal(t, "invalid_stream_token", e["type"])
				require.Contains(t, e["message"], "2 times")
				require.Equal(t, `Bearer realm="llmq", error="invalid_request"`, r.header.Get("WWW-Authenticate"))
			})
		}
	})
	t.Run("NotIssuedHere", func(t *testing.T) {
		t.Parallel()
		plain := setup(t, setupOpts{dbURL: b.dbURL})
		refused(t, plain.url, eventsURL, "invalid_stream_token")
		require.NotContains(t, plain.do(t, http.MethodGet, "/v1/jobs/"+id, "", token).body, "events_url")
	})
	t.Run("Expired", func(t *testing.T) {
		t.Parallel()
		clock := clocktest.New(time.Now())
		replica := setup(t, setupOpts{dbURL: b.dbURL, signer: mustSigner(t, string(streamKey), clock), noAnonymous: true})
		u := replica.do(t, http.MethodGet, "/v1/jobs/"+id, "", token).body["events_url"].(string)
		clock.Advance(10*time.Minute - time.Second)
		require.Equal(t, "queued/1", names([]sseFrame{openStreamPath(t, replica.url, u, "").nextEvent(t)})[0])
		clock.Advance(time.Second)
		refused(t, replica.url, u, "stream_token_expired")
	})
}

func mustSigner(t *testing.T, key string, clock *clocktest.Clock) *StreamSigner {
	t.Helper()
	s, err := NewStreamSigner([]byte(key), 10*time.Minute, clock.Now)
	require.NoError(t, err)
	return s
}

func TestNewStreamSigner_ShortKey(t *testing.T) {
	t.Parallel()
	_, err := NewStreamSigner(streamKey[:31], time.Minute, nil)
	require.Error(t, err)
}

// TestEvents_Preflight: a fetch-based stream client in a page of another origin (one that sends
// Last-Event-ID to resume) first sends a CORS preflight; it was answered 405, so such a client
// could never resume a signed stream.
func TestEvents_Preflight(t *testing.T) {
	t.Parallel()
	signer, err := NewStreamSigner(streamKey, 10*time.Minute, time.Now)
	require.NoError(t, err)
	b := setup(t, setupOpts{signer: signer, noAnonymous: true})
	token := b.newTenant(t, "acme")
	submitted := b.do(t, http.MethodPost, "/v1/jobs", `{"request":{"model":"m"}}`, token)
	require.Equal(t, http.StatusAccepted, submitted.status)
	eventsURL := submitted.body["events_url"].(string)

	// What Chromium sends before a fetch of the URL with Last-Event-ID.
	r := b.do(t, http.MethodOptions, eventsURL, "", map[string]string{"Origin": "https://app.example",
		"Access-Control-Request-Method": "GET", "Access-Control-Request-Headers": "last-event-id"})
	require.Equal(t, http.StatusNoContent, r.status)
	require.Equal(t, "*", r.header.Get("Access-Control-Allow-Origin"))
	require.Contains(t, r.header.Get("Access-Control-Allow-Methods"), "GET")
	require.Contains(t, strings.ToLower(r.header.Get("Access-Control-Allow-Headers")), "last-event-id")
	require.NotContains(t, strings.ToLower(r.header.Get("Access-Control-Allow-Headers")), "authorization",
		"a page holds a signed URL, never a bearer token")
	require.Empty(t, r.header.Get("Access-Control-Allow-Credentials"))

	// The resumed stream itself, and its refusal, are readable by that page.
	s := openStreamPath(t, b.url, eventsURL, "0")
	require.Equal(t, "*", s.resp.Header.Get("Access-Control-Allow-Origin"))
	bad := do(t, b.url, http.MethodGet, eventsURL+"x", "", map[string]string{"Last-Event-ID": "0"})
	require.Equal(t, http.StatusUnauthorized, bad.status)
	require.Equal(t, "*", bad.header.Get("Access-Control-Allow-Origin"))
}
