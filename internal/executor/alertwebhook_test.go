package executor_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/alert"
	"github.com/llmq/llmq/internal/credpause"
	"github.com/llmq/llmq/internal/dispatch"
	"github.com/llmq/llmq/internal/executor"
	"github.com/llmq/llmq/internal/jobs"
	"github.com/llmq/llmq/internal/jobstest"
	"github.com/llmq/llmq/internal/limiter"
	"github.com/llmq/llmq/internal/llm"
	"github.com/llmq/llmq/internal/llmsim"
	"github.com/llmq/llmq/internal/redistest"
)

// TestExecutor_SpendCapDoesNotWaitForTheAlertWebhook: a spend cap's alert is raised before the
// dead letter is recorded (or the job fails over); with a webhook that does not answer, the
// delivery still ends at once, and the alert reaches the webhook all the same. It waited for
// the POST's 10 s timeout.
func TestExecutor_SpendCapDoesNotWaitForTheAlertWebhook(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	posted := make(chan string, 4)
	released := make(chan struct{})
	var once sync.Once
	release := func() { once.Do(func() { close(released) }) }
	hook := httptest.NewServer(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		posted <- string(body)
		<-released // no answer until the test is done
	}))
	t.Cleanup(hook.Close)
	t.Cleanup(release) // before hook.Close, which waits for the handler

	b := jobstest.New(t)
	lim, err := limiter.New(redistest.Client(t), &limiter.Config{Prefix: redistest.Prefix(t)})
	require.NoError(t, err)
	gate := lim.Gate("sk-capped", "capped")
	_, err = gate.Resume(ctx) // Redis knows the credential is not paused
	require.NoError(t, err)
	capped := executor.Upstream{Name: "capped", Kind: string(llm.KindAnthropic), Gate: gate,
		Provider: simProvider(t, llmsim.Config{Faults: llmsim.Faults{SpendCap: true}}, "sk-capped")}
	// (the POST's bound an hour: a delivery that waited for it does not end within the test)
	alerter := alert.New(alert.Config{WebhookURL: hook.URL, PostTimeout: time.Hour})
	ex := executor.New(executor.Config{Store: b.Store, Pauses: credpause.NewStore(b.Pool, nil), Alerter: alerter,
		Upstreams: map[string]executor.Upstream{"capped": capped}})
	job, _, err := b.Store.Create(ctx, jobs.CreateParams{Tenant: "default", Credential: "capped",
		Request: helloRequest, MaxAttempts: 3, Timeout: time.Hour})
	require.NoError(t, err)

	// When the job's call is answered with a spend cap while the webhook hangs,
	processed := make(chan error, 1)
	go func() { processed <- ex.Process(ctx, dispatch.Delivery{JobID: job.ID}) }()
	select {
	case err := <-processed:
		require.NoError(t, err)
	case <-time.After(30 * time.Second):
		t.Fatal("the spend cap's delivery waited for the alert webhook")
	}

	// then the dead letter is recorded, and the alert is posted all the same.
	got, err := b.Store.Get(ctx, job.ID)
	require.NoError(t, err)
	require.Equal(t, jobs.StatusDead, got.Status)
	select {
	case body := <-posted:
		require.Contains(t, body, job.ID)
	case <-ctx.Done():
		t.Fatal("the alert never reached the webhook")
	}
	release()
	require.NoError(t, alerter.Wait(ctx))
}

// TestExecutor_SpendCapAlertsOnceAcrossProcesses: two worker processes (each its own executor and
// alerter) that both get a spend cap on one credential at the same time raise one alert between
// them: only the caller whose pause began the episode (the row it inserted) alerts.
func TestExecutor_SpendCapAlertsOnceAcrossProcesses(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	hookURL, posted := alertWebhook(t, 4)

	b := jobstest.New(t)
	prefix := redistest.Prefix(t)
	var (
		exs      []*executor.Executor
		alerters []*alert.Alerter
	)
	for range 2 { // a process each: its own limiter, pause store, alerter and executor
		lim, err := limiter.New(redistest.Client(t), &limiter.Config{Prefix: prefix})
		require.NoError(t, err)
		gate := lim.Gate("sk-capped", "capped")
		_, err = gate.Resume(ctx)
		require.NoError(t, err)
		capped := executor.Upstream{Name: "capped", Kind: string(llm.KindAnthropic), Gate: gate,
			Provider: simProvider(t, llmsim.Config{Faults: llmsim.Faults{SpendCap: true}}, "sk-capped")}
		a := alert.New(alert.Config{WebhookURL: hookURL, Redis: redistest.Client(t), Prefix: prefix})
		alerters = append(alerters, a)
		exs = append(exs, executor.New(executor.Config{Store: b.Store, Pauses: credpause.NewStore(b.Pool, nil), Alerter: a,
			Upstreams: map[string]executor.Upstream{"capped": capped}}))
	}
	var ids []string
	for range 2 {
		job, _, err := b.Store.Create(ctx, jobs.CreateParams{Tenant: "default", Credential: "capped",
			Request: helloRequest, MaxAttempts: 3, Timeout: time.Hour})
		require.NoError(t, err)
		ids = append(ids, job.ID)
	}

	processed := make(chan error, 2)
	for i, ex := range exs {
		go func() { processed <- ex.Process(ctx, dispatch.Delivery{JobID: ids[i]}) }()
	}
	for range 2 {
		select {
		case <-processed: // a delivery that found the credential paused is deferred: fine
		case <-ctx.Done():
			t.Fatal("a delivery did not end")
		}
	}
	for _, a := range alerters {
		require.NoError(t, a.Wait(ctx))
	}
	require.Len(t, posted, 1, "one alert for the episode, not one per process")
}
