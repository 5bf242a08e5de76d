package alert_test

import (
	"bytes"
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/alert"
)

// A webhook that cannot be reached is logged with its host, not its URL: a chat webhook's path
// (Slack's /services/T…/B…/token) is its secret.
func TestRaise_FailedWebhookLogsNoSecretPath(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		conn, _, err := http.NewResponseController(w).Hijack()
		if err == nil {
			conn.Close() // the connection dropped: no answer
		}
	}))
	t.Cleanup(srv.Close)
	var logs bytes.Buffer
	a := alert.New(alert.Config{WebhookURL: srv.URL + "/services/T000/B000/XXXXSECRETXXXX",
		Logger: slog.New(slog.NewJSONHandler(&logs, nil))})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	a.Raise(ctx, alert.Alert{Credential: "main", Reason: "rate_limited_no_retry_after", JobID: "j1"})

	out := logs.String()
	require.Contains(t, out, "alert webhook failed", "the failure is logged")
	require.Contains(t, out, strings.TrimPrefix(srv.URL, "http://"), "with the webhook's host")
	require.NotContains(t, out, "XXXXSECRETXXXX")
}

// Without Redis, Throttled still raises an alert at most once per interval per credential and
// reason, in this process (Config.Redis): a burst of retries_exhausted dead letters is one alert,
// not one per job.
func TestThrottled_WithoutRedisOncePerIntervalPerProcess(t *testing.T) {
	t.Parallel()
	var logs bytes.Buffer
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	a := alert.New(alert.Config{Logger: slog.New(slog.NewJSONHandler(&logs, nil)), Now: func() time.Time { return now }})
	ctx := context.Background()
	raise := func(cred, job string) {
		a.Throttled(ctx, alert.Alert{Credential: cred, Reason: "retries_exhausted", JobID: job}, time.Minute)
	}
	alerts := func() int { return strings.Count(logs.String(), "ALERT dead letter") }

	raise("main", "j1")
	raise("main", "j2")
	require.Equal(t, 1, alerts(), "a second dead letter within the interval is not alerted again")
	raise("backup", "j3")
	require.Equal(t, 2, alerts(), "another credential has a throttle of its own")
	now = now.Add(time.Minute)
	raise("main", "j4")
	require.Equal(t, 3, alerts(), "once the interval has passed the next one is alerted")
}

// TestRaise_CountsWebhookFailures: a POST to the webhook that fails (a status above 299, or no
// answer) counts in llmq_alert_webhook_failures_total, there at 0 from the start; one delivered
// does not. The log line alone left an alert lost on its way to the webhook unalerted.
func TestRaise_CountsWebhookFailures(t *testing.T) {
	t.Parallel()
	answers := make(chan int, 3)
	answers <- http.StatusInternalServerError
	answers <- http.StatusNoContent
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(<-answers)
	}))
	t.Cleanup(srv.Close)
	reg := prometheus.NewRegistry()
	a := alert.New(alert.Config{WebhookURL: srv.URL, Metrics: alert.NewMetrics(reg)})
	const name = "llmq_alert_webhook_failures_total"
	const head = "# HELP " + name + " Alerts whose POST to alerts.webhook_url failed (no answer, or a status above 299); " +
		"each is logged (\"alert webhook failed\") and not sent again.\n# TYPE " + name + " counter\n"
	require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(head+name+" 0\n"), name), "0 from the start")

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	al := alert.Alert{Credential: "main", Reason: "retries_exhausted", JobID: "j1"}
	a.Raise(ctx, al) // 500
	require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(head+name+" 1\n"), name))
	a.Raise(ctx, al) // 204
	require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(head+name+" 1\n"), name), "a delivered alert is not counted")
	srv.Close()
	a.Raise(ctx, al) // unreachable
	require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(head+name+" 2\n"), name))
}
