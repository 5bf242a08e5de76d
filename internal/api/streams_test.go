package api

import (
	"net/http"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
)

// TestEvents_ServerStreamCap: one replica holds at most api.max_streams event streams, every
// tenant's together; the next is answered 503 overloaded with Retry-After, before it reads
// anything, and counted. Only a per-tenant cap held them before: many tenants' streams could
// take every connection of the replica (api.max_connections), leaving none to submits and polls,
// and its memory with them.
func TestEvents_ServerStreamCap(t *testing.T) {
	t.Parallel()
	signer, err := NewStreamSigner(streamKey, 10*time.Minute, time.Now)
	require.NoError(t, err)
	reg, queries := prometheus.NewRegistry(), &queryCounter{}
	b := setup(t, setupOpts{signer: signer, registry: reg, queries: queries, maxServerStreams: 2})
	mine, theirs := b.create(t, ""), b.create(t, "acme")

	// Two tenants' streams: the anonymous one's, and acme's through its signed URL.
	require.Equal(t, "queued", openStream(t, b.url, mine.ID, "").nextEvent(t).event)
	acme := openStreamPath(t, b.url, signer.URL(theirs.ID), "")
	require.Equal(t, "queued", acme.nextEvent(t).event)

	before := queries.n.Load()
	for _, path := range []string{"/v1/jobs/" + mine.ID + "/events", signer.URL(theirs.ID)} {
		r := b.do(t, http.MethodGet, path, "", nil)
		require.Equal(t, http.StatusServiceUnavailable, r.status, path)
		require.Equal(t, "overloaded", r.body["error"].(map[string]any)["type"])
		require.Equal(t, "5", r.header.Get("Retry-After"))
	}
	require.Equal(t, int64(0), queries.n.Load()-before, "a stream over the cap reads nothing")
	require.Equal(t, 2.0, testutil.ToFloat64(gatheredCounter(t, reg, "llmq_event_streams_rejected_total", "reason", "server")))
	require.Equal(t, 0.0, testutil.ToFloat64(gatheredCounter(t, reg, "llmq_event_streams_rejected_total", "reason", "tenant")))
	require.Equal(t, 2.0, openStreams(reg))

	// A stream that ends frees its place.
	acme.close()
	require.Eventually(t, func() bool { return openStreams(reg) == 1 }, 30*time.Second, 5*time.Millisecond)
	require.Equal(t, "queued", openStreamPath(t, b.url, signer.URL(theirs.ID), "").nextEvent(t).event)
}

// openStreams is llmq_event_streams_open gathered from reg (-1: not gathered).
func openStreams(reg *prometheus.Registry) float64 {
	families, err := reg.Gather()
	if err != nil {
		return -1
	}
	for _, f := range families {
		if f.GetName() == "llmq_event_streams_open" && len(f.GetMetric()) == 1 {
			return f.GetMetric()[0].GetGauge().GetValue()
		}
	}
	return -1
}
