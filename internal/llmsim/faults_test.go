package llmsim_test

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/llmsim"
)

func TestServer_Faults(t *testing.T) {
	t.Parallel()

	t.Run("SpendCap", func(t *testing.T) {
		t.Parallel()
		b := setup(t, llmsim.Config{Capacity: 20, RefillPerSecond: 10})
		b.setFaults(t, `{"spend_cap":true}`)

		// Anthropic: 429, no retry-after, rate_limit_error with the spend-limit code
		r := b.anthropic(t, "k", helloBody)
		require.Equal(t, http.StatusTooManyRequests, r.status)
		require.Empty(t, r.header.Values("retry-after"))
		require.Equal(t, "20", r.header.Get("anthropic-ratelimit-requests-remaining"))
		var ab struct {
			Type  string `json:"type"`
			Error struct {
				Type    string `json:"type"`
				Message string `json:"message"`
				Details struct {
					ErrorCode string `json:"error_code"`
				} `json:"details"`
			} `json:"error"`
			RequestID string `json:"request_id"`
		}
		require.NoError(t, json.Unmarshal(r.body, &ab))
		require.Equal(t, "error", ab.Type)
		require.Equal(t, "rate_limit_error", ab.Error.Type)
		require.Equal(t, "enforced_spend_limit_reached", ab.Error.Details.ErrorCode)
		require.NotEmpty(t, ab.Error.Message)
		require.Equal(t, r.header.Get("request-id"), ab.RequestID)

		// OpenAI: 429 insufficient_quota, type and code
		r = b.openai(t, "k", helloBody)
		require.Equal(t, http.StatusTooManyRequests, r.status)
		require.Empty(t, r.header.Values("retry-after"))
		require.JSONEq(t, `{"error":{"message":"You exceeded your current quota, please check your plan and billing details (llmsim spend-cap fault).","type":"insufficient_quota","param":null,"code":"insufficient_quota"}}`, string(r.body))

		// Switched off at run time, requests succeed and the cap took no token
		b.setFaults(t, `{}`)
		r = b.anthropic(t, "k", helloBody)
		require.Equal(t, http.StatusOK, r.status)
		require.Equal(t, "19", r.header.Get("anthropic-ratelimit-requests-remaining"))
	})

	t.Run("OverloadedFor", func(t *testing.T) {
		t.Parallel()
		b := setup(t, llmsim.Config{})
		b.setFaults(t, `{"overloaded_for":"30s"}`)
		require.Equal(t, t0.Add(30*time.Second), b.sim.Faults().OverloadedUntil)

		r := b.anthropic(t, "k", helloBody)
		require.Equal(t, 529, r.status)
		require.Equal(t, "overloaded_error", r.errType(t))
		r = b.openai(t, "k", helloBody)
		require.Equal(t, http.StatusServiceUnavailable, r.status)
		require.Equal(t, "server_error", r.errType(t))

		b.clock.Advance(30 * time.Second)
		r = b.anthropic(t, "k", helloBody)
		require.Equal(t, http.StatusOK, r.status)
	})

	t.Run("OverloadedUntil", func(t *testing.T) {
		t.Parallel()
		b := setup(t, llmsim.Config{})
		b.setFaults(t, `{"overloaded_until":"2026-01-02T03:04:06Z","retry_after":"2s"}`)
		r := b.anthropic(t, "k", helloBody)
		require.Equal(t, 529, r.status)
		require.Equal(t, "2", r.header.Get("retry-after"))
		b.clock.Advance(time.Second)
		require.Equal(t, http.StatusOK, b.anthropic(t, "k", helloBody).status)
	})

	t.Run("FailNextCountsDownExactly", func(t *testing.T) {
		t.Parallel()
		b := setup(t, llmsim.Config{})
		b.setFaults(t, `{"fail_next":2,"fail_next_status":503}`)

		r := b.anthropic(t, "k", helloBody)
		require.Equal(t, http.StatusServiceUnavailable, r.status)
		require.Equal(t, "api_error", r.errType(t))
		require.Empty(t, r.header.Values("retry-after"))
		require.Equal(t, 1, b.sim.Faults().FailNext)

		r = b.openai(t, "k", helloBody)
		require.Equal(t, http.StatusServiceUnavailable, r.status)
		require.Equal(t, "server_error", r.errType(t))

		got := b.mustDo(t, http.MethodGet, "/_sim/faults", nil, "")
		require.Equal(t, http.StatusOK, got.status)
		require.Equal(t, float64(0), got.json(t)["fail_next"])

		for range 3 {
			require.Equal(t, http.StatusOK, b.anthropic(t, "k", helloBody).status)
		}
	})

	t.Run("FailNext429SendsRetryAfter", func(t *testing.T) {
		t.Parallel()
		b := setup(t, llmsim.Config{})
		b.setFaults(t, `{"fail_next":1,"fail_next_status":429}`)
		r := b.anthropic(t, "k", helloBody)
		require.Equal(t, http.StatusTooManyRequests, r.status)
		require.Equal(t, "rate_limit_error", r.errType(t))
		require.Equal(t, "1", r.header.Get("retry-after"))

		b.setFaults(t, `{"fail_next":1,"fail_next_status":429,"retry_after":"2500ms"}`)
		r = b.openai(t, "k", helloBody)
		require.Equal(t, http.StatusTooManyRequests, r.status)
		require.Equal(t, "3", r.header.Get("retry-after"))
		require.Equal(t, "rate_limit_exceeded", r.json(t)["error"].(map[string]any)["code"])
	})

	t.Run("ErrorRate", func(t *testing.T) {
		t.Parallel()
		b := setup(t, llmsim.Config{Rand: sequence(0.2, 0.7, 0.49, 0.5)})
		b.setFaults(t, `{"error_rate":0.5,"error_status":502}`)
		var got []int
		for range 4 {
			got = append(got, b.anthropic(t, "k", helloBody).status)
		}
		require.Equal(t, []int{502, 200, 502, 200}, got)
	})

	t.Run("ErrorRateDefaultStatus", func(t *testing.T) {
		t.Parallel()
		b := setup(t, llmsim.Config{})
		b.setFaults(t, `{"error_rate":1}`)
		r := b.anthropic(t, "k", helloBody)
		require.Equal(t, http.StatusInternalServerError, r.status)
		require.Equal(t, "api_error", r.errType(t))
	})

	t.Run("BadRequestMarker", func(t *testing.T) {
		t.Parallel()
		b := setup(t, llmsim.Config{})
		marked := `{"model":"m","messages":[{"role":"user","content":"please LLMSIM_BAD_REQUEST"}]}`
		r := b.anthropic(t, "k", marked)
		require.Equal(t, http.StatusBadRequest, r.status)
		require.Equal(t, "invalid_request_error", r.errType(t))
		r = b.openai(t, "k", marked)
		require.Equal(t, http.StatusBadRequest, r.status)
		require.Equal(t, "invalid_request_error", r.errType(t))

		b.setFaults(t, `{"bad_request_marker":"BOOM"}`)
		require.Equal(t, http.StatusOK, b.anthropic(t, "k", marked).status)
		r = b.anthropic(t, "k", `{"model":"m","messages":[{"role":"user","content":"BOOM"}]}`)
		require.Equal(t, http.StatusBadRequest, r.status)
	})

	t.Run("HangUntilClientGivesUp", func(t *testing.T) {
		t.Parallel()
		b := setup(t, llmsim.Config{})
		b.setFaults(t, `{"hang":true}`)
		ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
		defer cancel()
		_, err := b.do(t, ctx, http.MethodPost, "/v1/messages",
			map[string]string{"x-api-key": "k", "anthropic-version": "2023-06-01"}, helloBody)
		require.ErrorIs(t, err, context.DeadlineExceeded)
		// The handler is freed and counts the abandoned request
		require.Eventually(t, func() bool {
			st := b.sim.Stats()
			return st.InFlight == 0 && st.ByStatus[llmsim.StatusClientClosed] == 1
		}, 30*time.Second, 5*time.Millisecond)

		b.setFaults(t, `{}`)
		require.Equal(t, http.StatusOK, b.anthropic(t, "k", helloBody).status)
	})

	t.Run("SlowFirstByte", func(t *testing.T) {
		t.Parallel()
		b := setup(t, llmsim.Config{})
		const slow = 300 * time.Millisecond
		b.setFaults(t, `{"slow_first_byte":"300ms"}`)
		req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, b.ts.URL+"/v1/messages", strings.NewReader(helloBody))
		require.NoError(t, err)
		req.Header.Set("x-api-key", "k")
		req.Header.Set("anthropic-version", "2023-06-01")
		start := time.Now()
		resp, err := b.ts.Client().Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		headersAt := time.Since(start)
		var body map[string]any
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&body))
		bodyAt := time.Since(start)
		// The status arrives before the wait, the body after it
		require.Equal(t, http.StatusOK, resp.StatusCode)
		require.Equal(t, "message", body["type"])
		require.Less(t, headersAt, slow)
		require.GreaterOrEqual(t, bodyAt, slow)
	})

	t.Run("LatencyRespectsClient", func(t *testing.T) {
		t.Parallel()
		b := setup(t, llmsim.Config{Latency: time.Hour})
		ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
		defer cancel()
		_, err := b.do(t, ctx, http.MethodPost, "/v1/chat/completions",
			map[string]string{"authorization": "Bearer k"}, helloBody)
		require.ErrorIs(t, err, context.DeadlineExceeded)
		require.Eventually(t, func() bool {
			st := b.sim.Stats()
			return st.InFlight == 0 && st.ByStatus[llmsim.StatusClientClosed] == 1
		}, 30*time.Second, 5*time.Millisecond)
	})

	t.Run("LatencyPlusJitter", func(t *testing.T) {
		t.Parallel()
		// Given latency 40ms plus half of an 80ms jitter
		b := setup(t, llmsim.Config{Latency: 40 * time.Millisecond, LatencyJitter: 80 * time.Millisecond, Rand: sequence(0.5)})
		start := time.Now()
		r := b.anthropic(t, "k", helloBody)
		require.Equal(t, http.StatusOK, r.status)
		require.GreaterOrEqual(t, time.Since(start), 80*time.Millisecond)
	})

	t.Run("InvalidFaultsRejected", func(t *testing.T) {
		t.Parallel()
		b := setup(t, llmsim.Config{})
		b.setFaults(t, `{"fail_next":3}`)
		for body, want := range map[string]string{
			``:                              "decode faults",
			`{"fail_nxt":1}`:                "unknown field",
			`{"error_rate":2}`:              "error_rate",
			`{"error_status":200}`:          "error_status",
			`{"fail_next":-1}`:              "fail_next",
			`{"slow_first_byte":"soon"}`:    "slow_first_byte",
			`{"overloaded_for":"-1s"}`:      "overloaded_for",
			`{"hang":true} {"hang":false}`:  "after the JSON value",
			`{"overloaded_until":"monday"}`: "decode faults",
		} {
			r := b.mustDo(t, http.MethodPost, "/_sim/faults", nil, body)
			require.Equal(t, http.StatusBadRequest, r.status, "body %q", body)
			require.Equal(t, "invalid_request_error", r.errType(t))
			require.Contains(t, r.json(t)["error"].(map[string]any)["message"], want, "body %q", body)
		}
		require.Equal(t, 3, b.sim.Faults().FailNext, "rejected bodies change nothing")
		require.Error(t, b.sim.SetFaults(llmsim.Faults{ErrorRate: -0.1}))
	})

	t.Run("SetFaultsFromGo", func(t *testing.T) {
		t.Parallel()
		b := setup(t, llmsim.Config{})
		require.NoError(t, b.sim.SetFaults(llmsim.Faults{FailNext: 1, FailNextStatus: 504}))
		r := b.anthropic(t, "k", helloBody)
		require.Equal(t, http.StatusGatewayTimeout, r.status)
		require.Equal(t, "timeout_error", r.errType(t))
		require.Equal(t, http.StatusOK, b.anthropic(t, "k", helloBody).status)
	})
}

func TestFaults_JSON(t *testing.T) {
	t.Parallel()
	in := llmsim.Faults{
		SpendCap:         true,
		OverloadedUntil:  t0,
		ErrorRate:        0.25,
		ErrorStatus:      502,
		FailNext:         2,
		FailNextStatus:   503,
		RetryAfter:       1500 * time.Millisecond,
		BadRequestMarker: "X",
		Hang:             true,
		SlowFirstByte:    2 * time.Second,
	}
	data, err := json.Marshal(in)
	require.NoError(t, err)
	require.JSONEq(t, `{"spend_cap":true,"overloaded_until":"2026-01-02T03:04:05Z","error_rate":0.25,"error_status":502,
		"fail_next":2,"fail_next_status":503,"retry_after":"1.5s","bad_request_marker":"X","hang":true,"slow_first_byte":"2s"}`, string(data))
	var out llmsim.Faults
	require.NoError(t, json.Unmarshal(data, &out))
	require.Equal(t, in, out)
}
