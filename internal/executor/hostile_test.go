package executor_test

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/alert"
	"github.com/llmq/llmq/internal/executor"
	"github.com/llmq/llmq/internal/jobs"
	"github.com/llmq/llmq/internal/jobstest"
	"github.com/llmq/llmq/internal/llm"
)

// requireNoKeyPart fails when text holds any 8 consecutive characters of key.
func requireNoKeyPart(t *testing.T, key, where, text string) {
	t.Helper()
	for i := 0; i+8 <= len(key); i++ {
		require.NotContains(t, text, key[i:i+8], "part of the key survived in the %s", where)
	}
}

// A provider's answer is untrusted text, wherever it ends up. A hostile provider echoes the key
// across the place where an error body is cut, and sends control characters (a NUL, which
// Postgres refuses, and a terminal escape): the job's last error, its attempt's error, the
// dead-letter alert's log line and its webhook hold no part of the key, and the outcome is
// recorded.
func TestExecutor_HostileProviderText(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	const key = "sk-ant-api03-hostile-0123456789abcdefghijklmnopqrstuv"
	bodies := map[string]string{
		// The key straddles byte 200, where the excerpt of a non-JSON body is cut.
		"text": strings.Repeat("~", 180) + key + "\x00\x1b[2J" + strings.Repeat("~", 100),
		"json": `{"error":{"type":"api_error","message":"bad key ` + strings.ToLower(key) + ` \u0000\u001b[2J"}}`,
	}
	provider := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html")
		w.Header().Set("X-Echo", r.Header.Get("X-Api-Key"))
		w.WriteHeader(http.StatusBadGateway)
		_, _ = io.WriteString(w, bodies[r.URL.Query().Get("body")])
	}))
	t.Cleanup(provider.Close)
	webhook := make(chan string, 10)
	hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		webhook <- string(body)
	}))
	t.Cleanup(hook.Close)
	logFile := filepath.Join(t.TempDir(), "log") // an *os.File takes concurrent writes
	logs, err := os.Create(logFile)
	require.NoError(t, err)
	t.Cleanup(func() { _ = logs.Close() })
	logger := slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	b := jobstest.New(t)
	upstreams := map[string]executor.Upstream{}
	for name := range bodies {
		p, err := llm.New(llm.Config{Kind: llm.KindAnthropic, BaseURL: provider.URL, APIKey: key,
			HTTPClient: &http.Client{Transport: roundTripFunc(func(r *http.Request) (*http.Response, error) {
				r.URL.RawQuery = "body=" + name
				return http.DefaultTransport.RoundTrip(r)
			})}})
		require.NoError(t, err)
		upstreams[name] = executor.Upstream{Name: name, Kind: string(llm.KindAnthropic), Provider: p}
	}
	alerter := alert.New(alert.Config{WebhookURL: hook.URL, Logger: logger})
	ex := executor.New(executor.Config{Store: b.Store, Upstreams: upstreams, Logger: logger, Alerter: alerter})

	for _, name := range []string{"json", "text"} {
		// When a job's one attempt gets the hostile answer
		got, err := process(t, b, ex, name, 1, time.Minute)
		require.NoError(t, err)

		// Then it is recorded (dead: its attempts are used up), with no part of the key anywhere
		require.Equal(t, jobs.StatusDead, got.Status, name)
		requireNoKeyPart(t, key, name+" last_error", got.LastError.Message)
		requireNoKeyPart(t, strings.ToLower(key), name+" last_error", got.LastError.Message)
		require.Contains(t, got.LastError.Message, "[redacted]", name)
		require.NotContains(t, got.LastError.Message, "\x1b", name)
		attempts, err := b.Store.Attempts(ctx, got.ID)
		require.NoError(t, err)
		require.Len(t, attempts, 1)
		requireNoKeyPart(t, key, name+" attempt error", *attempts[0].Error)
		requireNoKeyPart(t, strings.ToLower(key), name+" attempt error", *attempts[0].Error)
		row, err := json.Marshal(got)
		require.NoError(t, err)
		requireNoKeyPart(t, key, name+" job (as the API and ctl show it)", string(row))
	}
	waitCtx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	require.NoError(t, alerter.Wait(waitCtx), "the alerts' posts end") // Raise posts in the background
	logged, err := os.ReadFile(logFile)
	require.NoError(t, err)
	require.Len(t, webhook, 2, "one webhook call per dead letter")
	for where, text := range map[string]string{"logs": string(logged), "webhook": <-webhook + <-webhook} {
		require.Contains(t, text, "retries_exhausted", "the %s got the dead-letter alerts", where)
		requireNoKeyPart(t, key, where, text)
		requireNoKeyPart(t, strings.ToLower(key), where, text)
	}
}

// roundTripFunc adapts a function to http.RoundTripper.
type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }
