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
