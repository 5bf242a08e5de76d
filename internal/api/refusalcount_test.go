package api

import (
	"context"
	"maps"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/httpserve/httpservetest"
)

// tenantRefusals is llmq_http_tenant_refusals_total gathered from reg, by "tenant/type".
func tenantRefusals(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	counted := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != "llmq_http_tenant_refusals_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, lp := range m.GetLabel() {
				labels[lp.GetName()] = lp.GetValue()
			}
			counted[labels["tenant"]+"/"+labels["type"]] = m.GetCounter().GetValue()
		}
	}
	return counted
}

// TestEvents_TooManyStreamsCountedByAuthenticatedTenant: a stream refused over its tenant's cap
// (429 too_many_streams) is counted in llmq_http_tenant_refusals_total under the tenant's name
// when the request authenticated as it, by a bearer token or a signed events_url, and under ""
// without either (the anonymous tenant "default").
func TestEvents_TooManyStreamsCountedByAuthenticatedTenant(t *testing.T) {
	t.Parallel()
	signer, err := NewStreamSigner(streamKey, 10*time.Minute, time.Now)
	require.NoError(t, err)
	reg := prometheus.NewRegistry()
	b := setup(t, setupOpts{signer: signer, registry: reg, maxStreams: 1})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	_, token, err := b.tenants.Create(ctx, "acme", nil)
	require.NoError(t, err)
	acmes, anonymous := b.create(t, "acme"), b.create(t, "")

	require.Equal(t, "queued", openStreamAs(ctx, t, b.url, acmes.ID, token).nextEvent(t).event)
	require.Equal(t, "queued", openStream(t, b.url, anonymous.ID, "").nextEvent(t).event)
	requireError(t, b.do(t, http.MethodGet, "/v1/jobs/"+acmes.ID+"/events", "", map[string]string{"Authorization": "Bearer " + token}),
		http.StatusTooManyRequests, "too_many_streams")
	requireError(t, b.do(t, http.MethodGet, signer.URL(acmes.ID), "", nil), http.StatusTooManyRequests, "too_many_streams")
	requireError(t, b.do(t, http.MethodGet, "/v1/jobs/"+anonymous.ID+"/events", "", nil), http.StatusTooManyRequests, "too_many_streams")
	require.Equal(t, map[string]float64{"acme/too_many_streams": 2, "/too_many_streams": 1}, tenantRefusals(t, reg))
}

// TestSubmit_TooManyBodiesCountedByAuthenticatedTenant: a submit refused because its tenant's
// bodies being read hold its share of the replica's budget (429 too_many_bodies) is counted in
// llmq_http_tenant_refusals_total under the tenant's name when the request authenticated as it,
// and under "" without a token (the anonymous tenant "default").
func TestSubmit_TooManyBodiesCountedByAuthenticatedTenant(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	// A tenant's share: one body of 1 KiB.
	b := setup(t, setupOpts{maxBody: 1024, maxBodyInFlight: 2048, registry: reg})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	_, token, err := b.tenants.Create(ctx, "acme", nil)
	require.NoError(t, err)
	addr := strings.TrimPrefix(b.url, "http://")
	for _, auth := range []string{"Authorization: Bearer " + token, ""} {
		// A body of the share's size that has not arrived: held for its tenant while it is read.
		held := httpservetest.Dial(t, addr, 0)
		head := []string{"Content-Length: 1024", "Content-Type: application/json"}
		if auth != "" {
			head = append(head, auth)
		}
		held.Send(t, http.MethodPost, "/v1/jobs", head...)
		h := map[string]string{}
		if auth != "" {
			h["Authorization"] = strings.TrimPrefix(auth, "Authorization: ")
		}
		require.Eventually(t, func() bool { return b.srv.bodies.inFlight() > 0 }, httpservetest.Wait, 5*time.Millisecond)
		requireError(t, b.do(t, http.MethodPost, "/v1/jobs", minimalSubmit, h), http.StatusTooManyRequests, "too_many_bodies")
		require.NoError(t, held.Close())
		require.Eventually(t, func() bool { return b.srv.bodies.inFlight() == 0 }, httpservetest.Wait, 5*time.Millisecond)
	}
	require.Equal(t, map[string]float64{"acme/too_many_bodies": 1, "/too_many_bodies": 1}, tenantRefusals(t, reg))
}

// TestMetrics_ADeletedTenantsRefusalsAreDropped: a tenant's deletion (tenant.Store.Delete, which
// ctl's and the console's offboarding end with) drops its llmq_http_tenant_refusals_total series
// on every API process listening (tenant.DeletedChannel), and no other tenant's. They stayed
// until the process restarted: the API never learnt of a delete.
func TestMetrics_ADeletedTenantsRefusalsAreDropped(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	b := setup(t, setupOpts{registry: reg})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, name := range []string{"acme", "globex"} {
		_, _, err := b.tenants.Create(ctx, name, nil)
		require.NoError(t, err)
		b.srv.cfg.Metrics.refusedOverShare(name, "too_many_streams")
		b.srv.cfg.Metrics.refusedOverShare(name, "too_many_bodies")
	}
	_, err := b.tenants.Revoke(ctx, "acme")
	require.NoError(t, err)
	require.NoError(t, b.tenants.Delete(ctx, "acme"))

	want := map[string]float64{"globex/too_many_streams": 1, "globex/too_many_bodies": 1}
	require.Eventually(t, func() bool { return maps.Equal(want, tenantRefusals(t, reg)) }, 30*time.Second, 5*time.Millisecond,
		"the deleted tenant's series dropped, the other's kept")
}
