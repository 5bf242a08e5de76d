package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// start runs run on an ephemeral loopback port and returns the base URL and
// a stop function that cancels it and returns run's error.
func start(t *testing.T, args ...string) (string, func() error) {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() {
		err := run(ctx, append([]string{"-listen", "127.0.0.1:0"}, args...), pw, io.Discard)
		_ = pw.CloseWithError(io.EOF)
		done <- err
	}()
	line, err := bufio.NewReader(pr).ReadString('\n')
	require.NoError(t, err)
	go func() { _, _ = io.Copy(io.Discard, pr) }()
	url, ok := strings.CutPrefix(strings.TrimSpace(line), "llmsim listening on ")
	require.True(t, ok, "first line: %q", line)
	return url, func() error {
		cancel()
		return <-done
	}
}

func TestRun(t *testing.T) {
	t.Parallel()

	t.Run("ServesAndStops", func(t *testing.T) {
		t.Parallel()
		url, stop := start(t, "-capacity", "2", "-rate", "1", "-fail-next", "1", "-fail-next-status", "503")

		post := func() *http.Response {
			req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, url+"/v1/messages",
				strings.NewReader(`{"model":"m","messages":[{"role":"user","content":"hi"}]}`))
			require.NoError(t, err)
			req.Header.Set("x-api-key", "k")
			req.Header.Set("anthropic-version", "2023-06-01")
			resp, err := http.DefaultClient.Do(req)
			require.NoError(t, err)
			_, _ = io.Copy(io.Discard, resp.Body)
			require.NoError(t, resp.Body.Close())
			return resp
		}
		require.Equal(t, http.StatusServiceUnavailable, post().StatusCode)
		resp := post()
		require.Equal(t, http.StatusOK, resp.StatusCode)
		require.Equal(t, "2", resp.Header.Get("anthropic-ratelimit-requests-limit"))
		require.Equal(t, http.StatusTooManyRequests, post().StatusCode)

		require.NoError(t, stop())
		http.DefaultClient.CloseIdleConnections()
	})

	t.Run("TokenLimits", func(t *testing.T) {
		t.Parallel()
		url, stop := start(t, "-input-tpm", "100", "-output-tpm", "50", "-token-minute", "1s", "-reply-tokens", "7")
		post := func(maxTokens int) (*http.Response, map[string]any) {
			return postMessage(t, url, maxTokens, strings.Repeat("a", 200))
		}
		resp, body := post(10)
		require.Equal(t, http.StatusOK, resp.StatusCode, "%v", body)
		require.Equal(t, map[string]any{"input_tokens": 50.0, "output_tokens": 7.0}, body["usage"])
		require.Equal(t, "100", resp.Header.Get("anthropic-ratelimit-input-tokens-limit"))
		require.Equal(t, "50", resp.Header.Get("anthropic-ratelimit-output-tokens-limit"))
		resp, body = post(51)
		require.Equal(t, http.StatusBadRequest, resp.StatusCode)
		require.Contains(t, fmt.Sprint(body), "output-token rate limit of 50")

		require.NoError(t, stop())
		http.DefaultClient.CloseIdleConnections()
	})

	t.Run("ContextTokens", func(t *testing.T) {
		t.Parallel()
		url, stop := start(t, "-context-tokens", "10")
		resp, body := postMessage(t, url, 5, strings.Repeat("a", 40)) // 10 tokens: fits
		require.Equal(t, http.StatusOK, resp.StatusCode, "%v", body)
		resp, body = postMessage(t, url, 5, strings.Repeat("a", 44)) // 11 tokens: over the window
		require.Equal(t, http.StatusBadRequest, resp.StatusCode, "%v", body)
		require.Contains(t, fmt.Sprint(body), "prompt is too long: 11 tokens > 10 maximum")

		require.NoError(t, stop())
		http.DefaultClient.CloseIdleConnections()
	})

	t.Run("HangEndsAtShutdown", func(t *testing.T) {
		t.Parallel()
		url, stop := start(t, "-hang")
		// Each client has a transport of its own. On a shared one, the poll below could take the
		// connection dialed for the hanging request, or the other way round, and leave a second
		// connection that never carries a request: net/http's Shutdown waits up to 5 s for such a
		// new connection, which is not what this test is about.
		hangClient := &http.Client{Transport: &http.Transport{}}
		pollClient := &http.Client{Transport: &http.Transport{}}
		defer pollClient.CloseIdleConnections()
		errc := make(chan error, 1)
		go func() {
			req, err := http.NewRequestWithContext(context.Background(), http.MethodPost, url+"/v1/chat/completions", strings.NewReader(`{}`))
			if err != nil {
				errc <- err
				return
			}
			req.Header.Set("authorization", "Bearer k")
			resp, err := hangClient.Do(req)
			if err == nil {
				resp.Body.Close()
			}
			errc <- err
		}()
		// Once the request hangs, shutdown ends it instead of waiting for it
		require.Eventually(t, func() bool {
			resp, err := pollClient.Get(url + "/_sim/stats")
			if err != nil {
				return false
			}
			defer resp.Body.Close()
			var st struct {
				InFlight int `json:"in_flight"`
			}
			return json.NewDecoder(resp.Body).Decode(&st) == nil && st.InFlight == 1
		}, 30*time.Second, 5*time.Millisecond)
		pollClient.CloseIdleConnections()
		require.NoError(t, stop())
		require.Error(t, <-errc)
	})

	t.Run("RefusesRemoteListen", func(t *testing.T) {
		t.Parallel()
		for _, addr := range []string{"0.0.0.0:0", ":0", "192.0.2.1:80", "example.com:80"} {
			err := run(t.Context(), []string{"-listen", addr}, io.Discard, io.Discard)
			require.ErrorContains(t, err, "loopback", addr)
		}
	})

	t.Run("BadFlags", func(t *testing.T) {
		t.Parallel()
		for _, args := range [][]string{
			{"-capacity", "5"},
			{"-input-tpm", "-1"},
			{"-output-tpm", "-1"},
			{"-token-minute", "-1s"},
			{"-reply-tokens", "-1"},
			{"-context-tokens", "-1"},
			{"-error-rate", "2"},
			{"-log-level", "loud"},
			{"-nope"},
			{"extra"},
		} {
			require.Error(t, run(t.Context(), args, io.Discard, io.Discard), "%q", args)
		}
	})
}

// postMessage sends an Anthropic Messages request of text asking for maxTokens to the simulator
// at url, and returns its answer and decoded body.
func postMessage(t *testing.T, url string, maxTokens int, text string) (*http.Response, map[string]any) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, url+"/v1/messages",
		strings.NewReader(fmt.Sprintf(`{"model":"m","max_tokens":%d,"messages":[{"role":"user","content":"%s"}]}`,
			maxTokens, text)))
	require.NoError(t, err)
	req.Header.Set("x-api-key", "k")
	req.Header.Set("anthropic-version", "2023-06-01")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	var body map[string]any
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&body))
	return resp, body
}
