package e2e_test

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/alert"
	"github.com/llmq/llmq/internal/limiter"
	"github.com/llmq/llmq/internal/llmsim"
	"github.com/llmq/llmq/internal/redistest"
)

// webhook records the alerts POSTed to it.
type webhook struct {
	mu     sync.Mutex
	alerts []alert.Alert
}

func (w *webhook) ServeHTTP(rw http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	var a alert.Alert
	_ = json.Unmarshal(body, &a)
	w.mu.Lock()
	w.alerts = append(w.alerts, a)
	w.mu.Unlock()
}

func (w *webhook) received() []alert.Alert {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]alert.Alert(nil), w.alerts...)
}

func TestDeadLetter_SpendCapPausesCredentialAndAlertsOnce(t *testing.T) {
	t.Parallel()
	hook := &webhook{}
	hookSrv := httptest.NewServer(hook)
	t.Cleanup(hookSrv.Close)
	b := setup(t, setupOpts{
		sim:        llmsim.Config{Faults: llmsim.Faults{SpendCap: true}},
		webhookURL: hookSrv.URL,
	})

	// Given a provider answering 429 without Retry-After (a spend cap),
	// when a job runs, then it is dead after exactly one call and one alert goes out.
	first := b.submit(t, anthropicBody("over the cap"))
	job := b.waitTerminal(t, first)
	require.Equal(t, "dead", job["status"])
	require.Equal(t, "rate_limited_no_retry_after", job["dead_reason"])
	require.Equal(t, 1, b.sim.Stats().Requests)

	cred := b.limiterCredential(t, "default")
	ps, err := cred.Paused(b.ctx)
	require.NoError(t, err)
	require.True(t, ps.Paused)
	require.Equal(t, first, ps.FirstJobID)

	// Later jobs on the paused credential wait without a call: each delivery is deferred.
	var later []string
	for range 3 {
		later = append(later, b.submit(t, anthropicBody("waiting politely")))
	}
	insp := b.inspector(t)
	for _, id := range later {
		require.Eventually(t, func() bool {
			_, why, ok := b.deferral(insp, id)
			return ok && strings.Contains(why, "credential paused")
		}, 20*time.Second, 20*time.Millisecond, "job %s was never deferred by the pause", id)
	}
	require.Equal(t, 1, b.sim.Stats().Requests, "a paused credential sent requests")
	for _, id := range later {
		r := b.do(t, http.MethodGet, "/v1/jobs/"+id, "", nil)
		require.Equal(t, "queued", r.body["status"])
		require.EqualValues(t, 0, r.body["attempts"])
	}

	alerts := hook.received()
	require.Len(t, alerts, 1)
	require.Equal(t, "default", alerts[0].Credential)
	require.Equal(t, "rate_limited_no_retry_after", alerts[0].Reason)
	require.Equal(t, first, alerts[0].JobID)

	// When the operator lifts the cap and resumes the credential, the waiting jobs go through.
	require.NoError(t, b.sim.SetFaults(llmsim.Faults{}))
	resumed, err := cred.Resume(b.ctx)
	require.NoError(t, err)
	require.True(t, resumed)
	for _, id := range later {
		require.Equal(t, "succeeded", b.waitTerminal(t, id)["status"])
	}
	require.Equal(t, 4, b.sim.Stats().Requests)
	require.Len(t, hook.received(), 1, "one alert per pause episode")
}

// limiterCredential returns the shared limiter state of a configured credential, as the worker
// sees it.
func (b *testBundle) limiterCredential(t *testing.T, name string) *limiter.Gate {
	t.Helper()
	lim, err := limiter.New(redistest.ClientOf(t, b.redisURL), &limiter.Config{Prefix: b.prefix})
	require.NoError(t, err)
	c, ok := b.cfg.Credential(name)
	require.True(t, ok)
	return lim.Gate(c.LimiterID(), name)
}

func TestDeadLetter_PauseProbeResumesCredential(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{
		sim:   llmsim.Config{Faults: llmsim.Faults{SpendCap: true}},
		extra: "pause_probe_interval: 200ms",
	})

	// Given a credential paused by a spend cap,
	first := b.submit(t, anthropicBody("over the cap"))
	require.Equal(t, "dead", b.waitTerminal(t, first)["status"])
	ps, err := b.limiterCredential(t, "default").Paused(b.ctx)
	require.NoError(t, err)
	require.True(t, ps.Paused)

	// when the provider recovers, then one automatic probe gets through, resumes the
	// credential, and every waiting job succeeds without an operator.
	require.NoError(t, b.sim.SetFaults(llmsim.Faults{}))
	var later []string
	for range 3 {
		later = append(later, b.submit(t, anthropicBody("after the probe")))
	}
	for _, id := range later {
		require.Equal(t, "succeeded", b.waitTerminal(t, id)["status"])
	}
	ps, err = b.limiterCredential(t, "default").Paused(b.ctx)
	require.NoError(t, err)
	require.False(t, ps.Paused)
	require.Equal(t, 4, b.sim.Stats().Requests)
}
