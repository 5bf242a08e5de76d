package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/config"
	"github.com/llmq/llmq/internal/llmsim"
	"github.com/llmq/llmq/internal/tokens"
)

func defaultTokensOpts(t *testing.T) tokensOpts {
	t.Helper()
	o, err := parseTokensFlags(nil, io.Discard)
	require.NoError(t, err)
	return o
}

func TestParseTokensFlags(t *testing.T) {
	t.Parallel()
	t.Run("Defaults", func(t *testing.T) {
		t.Parallel()
		o := defaultTokensOpts(t)
		require.Equal(t, 100, o.n)
		require.Equal(t, 2000, o.inputTokens)
		require.Equal(t, 200, o.maxTokens)
		require.Equal(t, 150, o.replyTokens)
		require.InDelta(t, 50.0, o.rps, 0)
		require.Equal(t, 50, o.burst)
		require.Equal(t, 40000, o.inputTPM)
		require.Equal(t, 8000, o.outputTPM)
		require.Equal(t, 6*time.Second, o.tokenMinute)
		require.Zero(t, o.latency)
		require.Equal(t, 4, o.workers)
		require.Equal(t, 3*time.Minute, o.timeout)
		require.Equal(t, []string{"llmq-requests", "llmq-known", "llmq-learned"}, tokensRowIDs(o))
	})
	t.Run("Invalid", func(t *testing.T) {
		t.Parallel()
		for _, tc := range []struct {
			args []string
			want string
		}{
			{[]string{"-n", "0"}, "-n: must be at least 1"},
			{[]string{"-token-minute", "500ms"}, "-token-minute: must be at least 1s"},
			{[]string{"-input-tpm", "1000"}, "-input-tpm: must be at least -input-tokens"},
			{[]string{"-output-tpm", "100"}, "-output-tpm: must be at least -max-tokens"},
			{[]string{"-reply-tokens", "0"}, "-reply-tokens: must be at least 1"},
			{[]string{"extra"}, "unexpected arguments: extra"},
		} {
			_, err := parseTokensFlags(tc.args, io.Discard)
			require.ErrorContains(t, err, tc.want, tc.args)
		}
	})
}

func TestRun_Tokens(t *testing.T) {
	t.Parallel()
	t.Run("BadFlag", func(t *testing.T) {
		t.Parallel()
		var out, errOut bytes.Buffer
		require.ErrorContains(t, run(context.Background(), []string{"tokens", "-burst", "0"}, &out, &errOut), "-burst: must be at least 1")
		require.Empty(t, out.String())
	})
	t.Run("UnknownRow", func(t *testing.T) {
		t.Parallel()
		var out, errOut bytes.Buffer
		err := run(context.Background(), []string{"tokens", "-only", "llmq-known,herd"}, &out, &errOut)
		require.ErrorContains(t, err, `unknown row "herd"`)
		require.ErrorContains(t, err, "llmq-learned")
	})
	t.Run("InUsage", func(t *testing.T) {
		t.Parallel()
		var out, errOut bytes.Buffer
		require.NoError(t, run(context.Background(), []string{"help"}, &out, &errOut))
		require.Contains(t, out.String(), "tokens")
	})
}

func TestTokenFloor(t *testing.T) {
	t.Parallel()
	t.Run("DefaultShape", func(t *testing.T) {
		t.Parallel()
		o := defaultTokensOpts(t)
		b := o.buckets()
		require.Len(t, b, 3)
		require.Equal(t, time.Second, b[0].time(), "(100 − 50) / 50")
		require.Equal(t, 24*time.Second, b[1].time(), "(200,000 − 40,000) / (40,000 / 6 s)")
		require.Equal(t, 5250*time.Millisecond, b[2].time(), "(15,000 − 8,000) / (8,000 / 6 s): the reply, not max_tokens")
		floor, binding := tokenFloor(b)
		require.Equal(t, 24*time.Second, floor)
		require.Equal(t, "input tokens", b[binding].name)
	})
	t.Run("OutputBinds", func(t *testing.T) {
		t.Parallel()
		o := defaultTokensOpts(t)
		o.replyTokens, o.maxTokens, o.inputTokens = 1000, 1000, 100
		floor, binding := tokenFloor(o.buckets())
		require.Equal(t, "output tokens", o.buckets()[binding].name)
		require.Equal(t, 69*time.Second, floor, "(1,000 × 100 − 8,000) / (8,000 / 6 s)")
	})
	t.Run("ReplyCutAtMaxTokens", func(t *testing.T) {
		t.Parallel()
		o := defaultTokensOpts(t)
		o.replyTokens, o.maxTokens = 500, 200
		require.Equal(t, 200, o.replyTokensPerJob())
	})
	t.Run("EverythingFits", func(t *testing.T) {
		t.Parallel()
		floor, binding := tokenFloor([]floorBucket{{charged: 10, capacity: 20, rate: 1}, {charged: 5, capacity: 5, rate: 1}})
		require.Zero(t, floor)
		require.Equal(t, 0, binding)
		require.Zero(t, floorBucket{charged: 10, capacity: 1}.time(), "no refill: not judged")
	})
}

func TestTokensTarget_Checks(t *testing.T) {
	t.Parallel()
	floor := 24 * time.Second
	good := result{n: 100, succeeded: 100, requests: 100, complete: true, last: 25 * time.Second}
	passes := func(cs []tokensCheck) []bool {
		out := make([]bool, len(cs))
		for i, c := range cs {
			out[i] = c.pass
		}
		return out
	}
	t.Run("KnownMet", func(t *testing.T) {
		t.Parallel()
		cs := tokensKnownTarget.checks(good, floor)
		require.Equal(t, []bool{true, true, true}, passes(cs))
		require.Equal(t, "last result ≤ 1.05 × floor (25.20 s)", cs[2].what)
		require.Equal(t, "25.00 s, 1.04 × floor", cs[2].got)
		require.Equal(t, "PASS", tokensKnownTarget.verdict(good, floor))
	})
	t.Run("KnownMissed", func(t *testing.T) {
		t.Parallel()
		r := good
		r.tooMany, r.requests = 1, 101
		require.Equal(t, []bool{true, false, true}, passes(tokensKnownTarget.checks(r, floor)))
		require.Equal(t, "FAIL", tokensKnownTarget.verdict(r, floor))
		r = good
		r.last = 25300 * time.Millisecond
		require.Equal(t, []bool{true, true, false}, passes(tokensKnownTarget.checks(r, floor)))
	})
	t.Run("LearnedBoundaries", func(t *testing.T) {
		t.Parallel()
		r := good
		r.requests, r.tooMany, r.last = 110, 10, 27600*time.Millisecond
		cs := tokensLearnedTarget.checks(r, floor)
		require.Equal(t, []bool{true, true, true}, passes(cs), "429s are not judged; 1.10 per success and 1.15 × floor pass")
		require.Equal(t, "requests per success ≤ 1.1", cs[2].what)
		r.requests = 111
		require.Equal(t, []bool{true, true, false}, passes(tokensLearnedTarget.checks(r, floor)))
		r.requests, r.last = 110, 27601*time.Millisecond
		require.Equal(t, []bool{true, false, true}, passes(tokensLearnedTarget.checks(r, floor)))
	})
	t.Run("PerSuccessCountsFailures", func(t *testing.T) {
		t.Parallel()
		r := good
		r.succeeded, r.requests = 95, 100
		cs := tokensLearnedTarget.checks(r, floor)
		require.Equal(t, []bool{false, true, true}, passes(cs))
		require.Equal(t, "1.05", cs[2].got)
		r.succeeded = 0
		cs = tokensLearnedTarget.checks(r, floor)
		require.False(t, cs[2].pass)
		require.Equal(t, "n/a", cs[2].got)
	})
	t.Run("TimedOut", func(t *testing.T) {
		t.Parallel()
		r := good
		r.complete, r.last = false, 3*time.Minute
		cs := tokensLearnedTarget.checks(r, floor)
		require.False(t, cs[1].pass)
		require.Equal(t, "> 180.00 s, 7.50 × floor", cs[1].got)
	})
	t.Run("RowError", func(t *testing.T) {
		t.Parallel()
		r := result{n: 100, err: errors.New("api exited early")}
		for _, c := range tokensKnownTarget.checks(r, floor) {
			require.False(t, c.pass, c.what)
		}
		require.Equal(t, "FAIL", tokensKnownTarget.verdict(r, floor))
	})
}

func TestIsTokenHeader(t *testing.T) {
	t.Parallel()
	for name, want := range map[string]bool{
		"anthropic-ratelimit-input-tokens-limit":      true,
		"Anthropic-Ratelimit-Input-Tokens-Remaining":  true,
		"anthropic-ratelimit-output-tokens-reset":     true,
		"anthropic-ratelimit-tokens-limit":            true,
		"Anthropic-Ratelimit-Tokens-Remaining":        true,
		"x-ratelimit-limit-tokens":                    true,
		"X-Ratelimit-Remaining-Tokens":                true,
		"x-ratelimit-reset-tokens":                    true,
		"anthropic-ratelimit-requests-limit":          false,
		"anthropic-ratelimit-requests-remaining":      false,
		"x-ratelimit-limit-requests":                  false,
		"x-ratelimit-reset-requests":                  false,
		"retry-after":                                 false,
		"request-id":                                  false,
		"x-tokens":                                    false,
		"anthropic-ratelimit-input-tokens-limit-nope": true, // any *tokens-* of the family
	} {
		require.Equal(t, want, isTokenHeader(name), name)
	}
}

// simPost sends body to the simulator at url (Anthropic endpoint) and returns the answer's
// status and headers.
func simPost(t *testing.T, url string, body []byte) (int, http.Header) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, url+"/v1/messages", bytes.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("content-type", "application/json")
	req.Header.Set("x-api-key", "sk-test")
	req.Header.Set("anthropic-version", "2023-06-01")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	_, err = io.Copy(io.Discard, resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, resp.Header
}

func tokenHeaderNames(h http.Header) []string {
	var out []string
	for k := range h {
		if isTokenHeader(k) {
			out = append(out, k)
		}
	}
	return out
}

func TestHideTokenHeaders(t *testing.T) {
	t.Parallel()
	cfg := llmsim.Config{Capacity: 10, RefillPerSecond: 1, InputTokensPerMinute: 3000, OutputTokensPerMinute: 1000,
		TokenMinute: time.Hour, ReplyTokens: 50}
	body := tokensBody(0, 2000, 200)

	plain := httptest.NewServer(llmsim.New(cfg))
	defer plain.Close()
	status, h := simPost(t, plain.URL, body)
	require.Equal(t, http.StatusOK, status)
	require.Len(t, tokenHeaderNames(h), 9, "the simulator sends the input, output and tokens families: %v", h)

	hidden := httptest.NewServer(hideTokenHeaders(llmsim.New(cfg)))
	defer hidden.Close()
	status, h = simPost(t, hidden.URL, body)
	require.Equal(t, http.StatusOK, status)
	require.Empty(t, tokenHeaderNames(h))
	require.NotEmpty(t, h.Get("anthropic-ratelimit-requests-limit"), "request-limit headers pass")
	require.NotEmpty(t, h.Get("request-id"))

	// The second prompt does not fit the input bucket (1,000 left, refilling 3,000 an hour): 429
	// with Retry-After, and still no token headers.
	status, h = simPost(t, hidden.URL, tokensBody(1, 2000, 200))
	require.Equal(t, http.StatusTooManyRequests, status)
	require.NotEmpty(t, h.Get("retry-after"))
	require.Empty(t, tokenHeaderNames(h))
}

func TestTokenHeaderStripper_ImplicitHeader(t *testing.T) {
	t.Parallel()
	rec := httptest.NewRecorder()
	hideTokenHeaders(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("x-ratelimit-remaining-tokens", "5")
		w.Header().Set("x-ratelimit-remaining-requests", "7")
		_, _ = w.Write([]byte("ok")) // no WriteHeader: the header is written by Write
		w.Header().Set("x-ratelimit-limit-tokens", "too late to matter")
	})).ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/", nil))
	res := rec.Result()
	defer res.Body.Close()
	require.Equal(t, http.StatusOK, res.StatusCode)
	require.Empty(t, res.Header.Get("x-ratelimit-remaining-tokens"))
	require.Equal(t, "7", res.Header.Get("x-ratelimit-remaining-requests"))
	require.NoError(t, http.NewResponseController(rec).Flush(), "Unwrap reaches the flusher")
}

func TestTokensBody(t *testing.T) {
	t.Parallel()
	for _, in := range []int{1, 3, 2000} {
		body := tokensBody(42, in, 200)
		var req struct {
			MaxTokens int `json:"max_tokens"`
			Messages  []struct {
				Role    string `json:"role"`
				Content string `json:"content"`
			} `json:"messages"`
		}
		require.NoError(t, json.Unmarshal(body, &req))
		require.Len(t, req.Messages, 1)
		require.Len(t, req.Messages[0].Content, 4*in, "exactly 4 bytes per input token")
		require.Equal(t, 200, req.MaxTokens)
		got, err := tokens.Count(tokens.ProviderAnthropic, body)
		require.NoError(t, err)
		require.Equal(t, in, got.Input, "llmq's fixed rule counts what the simulator charges")
		require.Equal(t, 200, got.MaxOutput)
	}
	require.True(t, strings.HasPrefix(string(tokensBody(7, 2000, 200)), `{"model":"claude-bench","max_tokens":200,"messages":[{"role":"user","content":"tokens request 7: `))
	require.NotEqual(t, tokensBody(1, 2000, 200), tokensBody(2, 2000, 200))
}

func TestWriteConfig_Tokens(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "llmq.yaml")
	lim := &config.Limits{RequestsPerSecond: 50, Burst: 50, InputTokensPerMinute: 40000, OutputTokensPerMinute: 8000, TokensPerMinute: 48000}
	_, err := writeConfig(path, "postgres://postgres@127.0.0.1:5432/x?sslmode=disable", "redis://127.0.0.1:6379/0", "q",
		"http://127.0.0.1:9", "sk-x", llmqSetup{limits: lim, tokenMinute: 6 * time.Second})
	require.NoError(t, err)
	got, err := config.Load(path, func(k string) string { return map[string]string{simKeyEnv: "sk"}[k] })
	require.NoError(t, err)
	require.Equal(t, lim, got.Credentials[0].Limits)
	require.Equal(t, 6*time.Second, got.Worker.TokenMinute)

	o := defaultTokensOpts(t)
	rows := tokensRows(o)
	require.True(t, rows[0].hideTokens)
	require.Equal(t, &config.Limits{RequestsPerSecond: 50, Burst: 50}, rows[0].setup.limits)
	require.Equal(t, &config.Limits{RequestsPerSecond: 50, Burst: 50, InputTokensPerMinute: 40000, OutputTokensPerMinute: 8000},
		rows[1].setup.limits)
	require.False(t, rows[2].hideTokens)
	require.Equal(t, &config.Limits{RequestsPerSecond: 50, Burst: 50}, rows[2].setup.limits)
	for _, r := range rows {
		require.Equal(t, 6*time.Second, r.setup.tokenMinute, r.id)
	}
}

func TestTokensReport(t *testing.T) {
	t.Parallel()
	o := defaultTokensOpts(t)
	floor, binding := tokenFloor(o.buckets())
	rep := tokensReport{opts: o, floor: floor, binding: binding, command: "go run . tokens -write docs/benchmarks.md",
		date: time.Date(2026, 11, 29, 0, 0, 0, 0, time.UTC), machine: "linux/amd64, nproc 2",
		results: []tokensResult{
			{result: result{name: "llmq, request limit only", n: 100, succeeded: 54, requests: 140, tooMany: 86, last: 3 * time.Minute},
				id: "llmq-requests", hideTokens: true, inputCharged: 108000, outputCharged: 8100, byStatus: map[int]int{200: 54, 429: 86}},
			{result: result{name: "llmq, token limits known", n: 100, succeeded: 100, requests: 100, complete: true, last: 24460 * time.Millisecond},
				id: "llmq-known", tokensTarget: &tokensKnownTarget, inputCharged: 200000, outputCharged: 15000},
			{result: result{name: "llmq, token limits learned", n: 100, succeeded: 100, requests: 120, tooMany: 20, complete: true,
				last: 24350 * time.Millisecond}, id: "llmq-learned", tokensTarget: &tokensLearnedTarget, inputCharged: 200000, outputCharged: 15000},
		}}
	rows := rep.rows()
	require.Equal(t, []string{"", "PASS", "FAIL"}, []string{rows[0][9], rows[1][9], rows[2][9]})
	require.Equal(t, "> 7.50", rows[0][8])
	md := rep.markdown()
	require.True(t, strings.HasPrefix(md, "## tokens: "))
	require.Contains(t, md, "`go run . tokens -write docs/benchmarks.md` — 2026-11-29, linux/amd64, nproc 2.")
	require.Contains(t, md, "| llmq, token limits known | 100/100 | 100 | 0 | 1.00 |")
	require.Contains(t, md, "input tokens: (2,000 × 100 − 40,000) / (40,000 / 6s) = 24.00 s")
	require.Contains(t, md, "Floor 24.00 s (input tokens).")
	require.Contains(t, md, "140 provider requests = 100 first attempts + 40 retries")
	require.Contains(t, md, "stopped at -timeout (3m0s) with 54/100 succeeded")
	require.Contains(t, md, "llmq, token limits learned against its targets: 100/100 succeeded: PASS (100/100); "+
		"last result ≤ 1.15 × floor (27.60 s): PASS (24.35 s, 1.01 × floor); requests per success ≤ 1.1: FAIL (1.20).")
	require.Contains(t, md, "llmq, request limit only 108,000 input and 8,100 output tokens")
	require.NotContains(t, md, "Why ")
	require.Contains(t, rep.text(), "llmq, token limits learned")
}

func TestThousands(t *testing.T) {
	t.Parallel()
	for n, want := range map[int]string{0: "0", 999: "999", 1000: "1,000", 40000: "40,000", 1234567: "1,234,567", -8000: "-8,000"} {
		require.Equal(t, want, thousands(n))
	}
}
