package api

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/jobs"
)

// TestStreamURL_RevokedTenantIsRefused: a revoked tenant's signed events_url (a page's, or an
// attacker's who holds a URL of a tenant revoked for a leak) is refused as the tenant's bearer
// token is, 403 token_revoked, at open and at every reconnect, an EventSource's too: it ran to
// the URL's expiry, reopened at will with Last-Event-ID.
func TestStreamURL_RevokedTenantIsRefused(t *testing.T) {
	t.Parallel()
	b, _, eventsURL, _ := signedStream(t, time.Nanosecond)
	_, err := b.tenants.Revoke(context.Background(), "acme")
	require.NoError(t, err)
	for name, h := range map[string]map[string]string{
		"Open":                 nil,
		"Reconnect":            {"Last-Event-ID": "1"},
		"EventSourceReconnect": {"Last-Event-ID": "0", "Accept": "text/event-stream"},
	} {
		// Not parallel: a parallel subtest waits for a free slot, which in a loaded run of the
		// package came after the URL's 10 minutes (401 stream_token_expired, not 403).
		t.Run(name, func(t *testing.T) {
			r := b.do(t, http.MethodGet, eventsURL, "", h)
			requireError(t, r, http.StatusForbidden, "token_revoked")
			require.Equal(t, "*", r.header.Get("Access-Control-Allow-Origin"), "the page may read why")
		})
	}
}

// TestStreamURL_RevokedTenantsOpenStreamEnds: a signed stream open when its tenant is revoked
// ends at its next wake-up once the revocation reached the replica (the tenants' cache TTL, 1 ms
// here), as a bearer token's does, without delivering the job: with a "refused" event whose
// data is the error its reconnect is answered with, which then is.
func TestStreamURL_RevokedTenantsOpenStreamEnds(t *testing.T) {
	t.Parallel()
	b, id, eventsURL, s := signedStream(t, time.Millisecond)
	_, err := b.tenants.Revoke(context.Background(), "acme")
	require.NoError(t, err)
	b.attempt(t, id, jobs.Outcome{Status: jobs.StatusSucceeded, Result: []byte(`{"secret":"answer"}`)})
	requireRefused(t, s.rest(t), "token_revoked")
	requireError(t, b.do(t, http.MethodGet, eventsURL, "", map[string]string{"Last-Event-ID": "1"}),
		http.StatusForbidden, "token_revoked")
}

// signedStream sets up a server issuing signed stream URLs whose tenants' cache holds a lookup
// for tenantTTL, submits a job of tenant "acme" and opens its events_url, read past its "queued"
// event.
func signedStream(t *testing.T, tenantTTL time.Duration) (
	b *testBundle, id, eventsURL string, s *stream) {
	t.Helper()
	signer, err := NewStreamSigner(streamKey, 10*time.Minute, time.Now)
	require.NoError(t, err)
	b = setup(t, setupOpts{signer: signer, noAnonymous: true, tenantTTL: tenantTTL})
	submitted := b.do(t, http.MethodPost, "/v1/jobs", minimalSubmit, b.newTenant(t, "acme"))
	require.Equal(t, http.StatusAccepted, submitted.status)
	id, eventsURL = submitted.body["id"].(string), submitted.body["events_url"].(string)
	s = openStreamPath(t, b.url, eventsURL, "")
	require.Equal(t, "queued/1", names([]sseFrame{s.nextEvent(t)})[0])
	return b, id, eventsURL, s
}

// requireRefused requires the events a stream sent before it ended to be one "refused" event,
// without an id (the client keeps its Last-Event-ID), whose data is the error typ.
func requireRefused(t *testing.T, rest []sseFrame, typ string) {
	t.Helper()
	require.Len(t, rest, 1, "events: %v", names(rest))
	require.Equal(t, "refused/", names(rest)[0])
	e, ok := jobData(t, rest[0])["error"].(map[string]any)
	require.True(t, ok, "data %q", rest[0].data)
	require.Equal(t, typ, e["type"])
	require.NotEmpty(t, e["message"])
}

// TestStreamURL_TenantLookupFailureIsNotARefusal: the lookup of a signed URL's tenant failing
// (Postgres not answering within StoreTimeout) says nothing of the tenant: at open it is the
// 503 an EventSource reconnects after, not a 403 that would end it for good, and an open
// stream whose check fails goes on (keep-alives, no "refused" event) until a check Postgres
// answers refuses it.
func TestStreamURL_TenantLookupFailureIsNotARefusal(t *testing.T) {
	t.Parallel()
	signer, err := NewStreamSigner(streamKey, 10*time.Minute, time.Now)
	require.NoError(t, err)
	ticks := make(chan time.Time)
	// A TTL of 1 ns: every wake-up of the stream looks its tenant up again, in Postgres.
	b, proxy := proxiedStreamBundle(t, setupOpts{signer: signer, tenantTTL: time.Nanosecond,
		keepAliveTicks: ticks, retryRand: func() float64 { return 0.25 }})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, _, err = b.tenants.Create(ctx, "a", nil)
	require.NoError(t, err)
	job := b.create(t, "a")
	path := signer.URL(job.ID)
	const lookup = "FROM tenants WHERE name = $1"

	a := answerWhileSilenced(t, b, proxy, lookup, path, nil)
	require.Equal(t, http.StatusServiceUnavailable, a.status, a.body)
	a = answerWhileSilenced(t, b, proxy, lookup, path, map[string]string{"Accept": "text/event-stream"})
	requireReconnect(t, a, "1250")
	proxy.Reset()

	s := openStreamPath(t, b.url, path, "")
	require.Equal(t, "queued", s.nextEvent(t).event)
	tick := func(what string) { t.Helper(); sendTick(t, ticks, what) }
	wait := proxy.SilenceStatement(lookup)
	tick("keep-alive")
	require.True(t, wait(ctx), "the stream did not look its tenant up again")
	tick("keep-alive after its tenant's lookup") // which failed within StoreTimeout
	for range 2 {
		f, ok := s.next(t)
		require.True(t, ok, "the stream ended on a failed lookup of its tenant")
		require.Equal(t, "keep-alive", f.comment, "frame %+v", f)
	}

	proxy.Reset()
	_, err = b.tenants.Revoke(ctx, "a")
	require.NoError(t, err)
	rest := make(chan []sseFrame, 1)
	go func() { // not s.rest: no require outside the test's goroutine
		var events []sseFrame
		for {
			f, ok, err := readFrame(s.lines)
			if !ok || err != nil {
				rest <- events
				return
			}
			if f.comment == "" {
				events = append(events, f)
			}
		}
	}()
	deadline := time.After(30 * time.Second)
	for {
		select {
		case ticks <- time.Now():
		case events := <-rest:
			// The stream ends on the refusal of a check Postgres answered.
			requireRefused(t, events, "token_revoked")
			return
		case <-deadline:
			t.Fatal("the stream of a revoked tenant's URL goes on")
		}
	}
}
