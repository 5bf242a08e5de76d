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
	"github.com/llmq/llmq/internal/credpause"
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

// spendCapped is a bundle whose provider answers every call as a spend cap (429 without
// Retry-After), its alerts posted to the returned webhook.
func spendCapped(t *testing.T) (*testBundle, *webhook) {
	t.Helper()
	hook := &webhook{}
	hookSrv := httptest.NewServer(hook)
	t.Cleanup(hookSrv.Close)
	return setup(t, setupOpts{
		sim:        llmsim.Config{Faults: llmsim.Faults{SpendCap: true}},
		webhookURL: hookSrv.URL,
	}), hook
}

func TestDeadLetter_SpendCapPausesCredentialAndAlertsOnce(t *testing.T) {
	t.Parallel()
	b, hook := spendCapped(t)

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

	// The alert is posted in the background (alert.Alerter.Raise).
	require.Eventually(t, func() bool { return len(hook.received()) > 0 }, 30*time.Second, 10*time.Millisecond)
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

// TestDeadLetter_SpendCapPauseSurvivesRedisLosingItsData: a credential paused by a spend cap
// stays paused when Redis loses its data (a restart without persistence, a FLUSHALL): the pause
// is kept in Postgres, and a later job on the still-capped credential waits without a call, a
// second dead letter or a second alert.
func TestDeadLetter_SpendCapPauseSurvivesRedisLosingItsData(t *testing.T) {
	t.Parallel()
	b, hook := spendCapped(t)

	// Given a credential paused by a spend cap,
	first := b.submit(t, anthropicBody("over the cap"))
	require.Equal(t, "dead", b.waitTerminal(t, first)["status"])
	require.Equal(t, 1, b.sim.Stats().Requests)
	require.Eventually(t, func() bool { return len(hook.received()) == 1 }, 30*time.Second, 10*time.Millisecond)

	// when Redis loses every llmq key of this test (the limiter's, the breaker's, the pause),
	redistest.Unlink(b.ctx, redistest.ClientOf(t, b.redisURL), b.prefix+"*")

	// then a later job on the credential, whose cap still holds, is deferred as paused and sends
	// nothing.
	later := b.submit(t, anthropicBody("after the flush"))
	insp := b.inspector(t)
	require.Eventually(t, func() bool {
		_, why, ok := b.deferral(insp, later)
		return (ok && strings.Contains(why, "credential paused")) || b.sim.Stats().Requests > 1
	}, 20*time.Second, 20*time.Millisecond, "job %s neither deferred by the pause nor sent", later)
	require.Equal(t, 1, b.sim.Stats().Requests, "the paused credential sent a request after Redis lost its data")
	r := b.do(t, http.MethodGet, "/v1/jobs/"+later, "", nil)
	require.Equal(t, "queued", r.body["status"])
	require.Len(t, hook.received(), 1, "one alert per pause episode")
	ps, err := b.limiterCredential(t, "default").Paused(b.ctx)
	require.NoError(t, err)
	require.True(t, ps.Paused)
	require.Equal(t, first, ps.FirstJobID, "the episode restored is the one the first job began")

	// When the operator lifts the cap and resumes the credential (as ctl and the console do),
	// the waiting job goes through, and nothing is left to restore.
	require.NoError(t, b.sim.SetFaults(llmsim.Faults{}))
	pool, err := openPool(b.ctx, b.dbURL)
	require.NoError(t, err)
	defer pool.Close()
	resumed, err := credpause.NewStore(pool, nil).Resume(b.ctx, b.limiterCredential(t, "default"))
	require.NoError(t, err)
	require.True(t, resumed)
	require.Equal(t, "succeeded", b.waitTerminal(t, later)["status"])
	require.Equal(t, 0, b.countRows(t, "credential_pauses"))
}
