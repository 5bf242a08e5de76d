package llm_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/llm"
)

func TestParseKind(t *testing.T) {
	t.Parallel()

	for in, want := range map[string]llm.Kind{"anthropic": llm.KindAnthropic, " OpenAI ": llm.KindOpenAI, "ANTHROPIC": llm.KindAnthropic} {
		got, err := llm.ParseKind(in)
		require.NoError(t, err)
		require.Equal(t, want, got)
	}
	for _, in := range []string{"", "gemini", "anthropic-v2"} {
		_, err := llm.ParseKind(in)
		require.ErrorContains(t, err, "unknown provider kind")
	}
}

func TestNew(t *testing.T) {
	t.Parallel()

	tests := []struct {
		name    string
		cfg     llm.Config
		wantErr string
	}{
		{"UnknownKind", llm.Config{Kind: "gemini", BaseURL: "http://127.0.0.1:1"}, "Kind"},
		{"EmptyKind", llm.Config{BaseURL: "http://127.0.0.1:1"}, "Kind"},
		{"EmptyURL", llm.Config{Kind: llm.KindAnthropic}, "BaseURL: must be set"},
		{"HostPortOnly", llm.Config{Kind: llm.KindAnthropic, BaseURL: "127.0.0.1:8090"}, "BaseURL"},
		{"Relative", llm.Config{Kind: llm.KindAnthropic, BaseURL: "/v1"}, "not an absolute http(s) URL"},
		{"FTP", llm.Config{Kind: llm.KindOpenAI, BaseURL: "ftp://example.com"}, "not an absolute http(s) URL"},
		{"NoHost", llm.Config{Kind: llm.KindOpenAI, BaseURL: "https://"}, "no host"},
		{"Userinfo", llm.Config{Kind: llm.KindOpenAI, BaseURL: "https://user:hunter2@example.com"}, "must not contain credentials"},
		{"Query", llm.Config{Kind: llm.KindOpenAI, BaseURL: "https://example.com?x=1"}, "query or fragment"},
		{"NegativeMax", llm.Config{Kind: llm.KindOpenAI, BaseURL: "https://example.com", MaxResponseBytes: -1}, "MaxResponseBytes"},
		{"OKAnthropic", llm.Config{Kind: llm.KindAnthropic, BaseURL: "https://api.anthropic.com"}, ""},
		{"OKOpenAIWithV1", llm.Config{Kind: llm.KindOpenAI, BaseURL: "https://api.openai.com/v1/"}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()

			p, err := llm.New(tt.cfg)
			if tt.wantErr != "" {
				require.ErrorContains(t, err, tt.wantErr)
				require.NotContains(t, err.Error(), "hunter2")
				return
			}
			require.NoError(t, err)
			require.Equal(t, tt.cfg.Kind, p.Kind())
		})
	}
}

func TestProvider_Send_OK(t *testing.T) {
	t.Parallel()

	tests := []struct {
		kind     llm.Kind
		path     string
		respBody string
		want     llm.Usage
	}{
		{llm.KindAnthropic, "/v1/messages",
			`{"id":"msg_1","type":"message","role":"assistant","content":[{"type":"text","text":"hi"}],"usage":{"input_tokens":12,"output_tokens":34}}`,
			llm.Usage{InputTokens: 12, OutputTokens: 34}},
		{llm.KindOpenAI, "/v1/chat/completions",
			`{"id":"chatcmpl-1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"hi"}}],"usage":{"prompt_tokens":7,"completion_tokens":9,"total_tokens":16}}`,
			llm.Usage{InputTokens: 7, OutputTokens: 9}},
	}
	for _, tt := range tests {
		t.Run(string(tt.kind), func(t *testing.T) {
			t.Parallel()

			var (
				mu   sync.Mutex
				seen []*http.Request
				got  [][]byte
			)
			b := setup(t, tt.kind, func(w http.ResponseWriter, r *http.Request) {
				body, err := io.ReadAll(r.Body)
				if err != nil {
					http.Error(w, err.Error(), 500)
					return
				}
				mu.Lock()
				seen = append(seen, r)
				got = append(got, body)
				mu.Unlock()
				w.Header().Set("Content-Type", "application/json")
				w.Header().Set("X-Request-Id", "req_1")
				_, _ = io.WriteString(w, tt.respBody)
			}, bundleOpts{now: steppingClock(time.Millisecond)})

			sent := bodyFor(tt.kind)
			resp, err := b.provider.Send(t.Context(), sent, llm.SendOptions{})
			require.NoError(t, err)
			require.Equal(t, 200, resp.StatusCode)
			require.JSONEq(t, tt.respBody, string(resp.Body))
			require.Equal(t, tt.respBody, string(resp.Body), "body must be verbatim")
			require.Equal(t, tt.want, resp.Usage)
			require.Equal(t, "req_1", resp.Header.Get("X-Request-Id"))
			require.False(t, resp.RateLimit.Known)
			require.Positive(t, resp.TimeToFirstByte)
			require.Less(t, resp.TimeToFirstByte, resp.Latency, "first byte comes before the end of the body")

			require.Len(t, seen, 1)
			r := seen[0]
			require.Equal(t, http.MethodPost, r.Method)
			require.Equal(t, tt.path, r.URL.Path)
			require.Equal(t, sent, got[0], "request body must be sent verbatim")
			require.Equal(t, "application/json", r.Header.Get("Content-Type"))
			if tt.kind == llm.KindAnthropic {
				require.Equal(t, testKey, r.Header.Get("X-Api-Key"))
				require.Equal(t, "2023-06-01", r.Header.Get("Anthropic-Version"))
				require.Empty(t, r.Header.Get("Authorization"))
			} else {
				require.Equal(t, "Bearer "+testKey, r.Header.Get("Authorization"))
				require.Empty(t, r.Header.Get("X-Api-Key"))
				require.Empty(t, r.Header.Get("Anthropic-Version"))
			}
		})
	}
}

func TestProvider_Send_Concurrent(t *testing.T) {
	t.Parallel()

	var hits atomic.Int64
	b := setup(t, llm.KindAnthropic, func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		reply(200, `{"usage":{"input_tokens":1,"output_tokens":2}}`)(w, r)
	})
	var wg sync.WaitGroup
	errs := make(chan error, 50)
	for range 50 {
		wg.Go(func() {
			_, err := b.provider.Send(t.Context(), bodyFor(llm.KindAnthropic), llm.SendOptions{})
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	require.Equal(t, int64(50), hits.Load(), "one Send is one request: no retries underneath")
}

func TestProvider_Send_BaseURLPath(t *testing.T) {
	t.Parallel()

	tests := []struct {
		name, kind, base, want string
	}{
		{"TrailingSlash", "anthropic", "/", "/v1/messages"},
		{"V1NotDoubled", "openai", "/v1", "/v1/chat/completions"},
		{"V1SlashNotDoubled", "openai", "/v1/", "/v1/chat/completions"},
		{"PathPrefix", "anthropic", "/proxy/anthropic", "/proxy/anthropic/v1/messages"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()

			paths := make(chan string, 1)
			b := setup(t, llm.Kind(tt.kind), func(w http.ResponseWriter, r *http.Request) {
				paths <- r.URL.Path
				reply(200, `{}`)(w, r)
			}, bundleOpts{base: tt.base})
			_, err := b.provider.Send(t.Context(), bodyFor(llm.Kind(tt.kind)), llm.SendOptions{})
			require.NoError(t, err)
			require.Equal(t, tt.want, <-paths)
		})
	}
}

func TestProvider_Send_StatusError(t *testing.T) {
	t.Parallel()

	tests := []struct {
		name     string
		kind     llm.Kind
		handler  http.HandlerFunc
		want     llm.StatusError // Header, timings not compared
		wantType string          // ErrorType()
		header   map[string]string
	}{
		{
			name: "Anthropic400", kind: llm.KindAnthropic,
			handler:  reply(400, `{"type":"error","error":{"type":"invalid_request_error","message":"max_tokens: Field required"},"request_id":"req_1"}`),
			want:     llm.StatusError{StatusCode: 400, Type: "invalid_request_error", Message: "max_tokens: Field required"},
			wantType: "invalid_request_error",
		},
		{
			name: "Anthropic429RetryAfter", kind: llm.KindAnthropic,
			handler: reply(429, `{"type":"error","error":{"type":"rate_limit_error","message":"Number of requests has exceeded your per-minute rate limit"}}`,
				"Retry-After", "2", "X-Should-Retry", "true",
				"Anthropic-Ratelimit-Requests-Limit", "50", "Anthropic-Ratelimit-Requests-Remaining", "0",
				"Anthropic-Ratelimit-Requests-Reset", "2026-03-01T12:00:02Z"),
			want: llm.StatusError{StatusCode: 429, Type: "rate_limit_error", Message: "Number of requests has exceeded your per-minute rate limit",
				RateLimit: llm.RateLimit{Known: true, Limit: 50, Remaining: 0, ResetAt: testNow.Add(2 * time.Second), ResetAbsolute: true,
					Date: testNow}},
			wantType: "rate_limit_error",
			header:   map[string]string{"Retry-After": "2", "X-Should-Retry": "true"},
		},
		{
			name: "Anthropic429SpendLimit", kind: llm.KindAnthropic,
			handler:  reply(429, `{"type":"error","error":{"type":"rate_limit_error","message":"You have reached your monthly spend limit","details":{"error_code":"enforced_spend_limit_reached"}}}`),
			want:     llm.StatusError{StatusCode: 429, Type: "rate_limit_error", Code: "enforced_spend_limit_reached", Message: "You have reached your monthly spend limit"},
			wantType: "enforced_spend_limit_reached",
		},
		{
			name: "OpenAI429InsufficientQuota", kind: llm.KindOpenAI,
			handler:  reply(429, `{"error":{"message":"You exceeded your current quota, please check your plan and billing details.","type":"insufficient_quota","param":null,"code":"insufficient_quota"}}`),
			want:     llm.StatusError{StatusCode: 429, Type: "insufficient_quota", Code: "insufficient_quota", Message: "You exceeded your current quota, please check your plan and billing details."},
			wantType: "insufficient_quota",
		},
		{
			name: "OpenAI429RateLimit", kind: llm.KindOpenAI,
			handler: reply(429, `{"error":{"message":"Rate limit reached for requests","type":"requests","param":null,"code":"rate_limit_exceeded"}}`,
				"Retry-After-Ms", "750", "X-Ratelimit-Limit-Requests", "60", "X-Ratelimit-Remaining-Requests", "0", "X-Ratelimit-Reset-Requests", "750ms"),
			want: llm.StatusError{StatusCode: 429, Type: "requests", Code: "rate_limit_exceeded", Message: "Rate limit reached for requests",
				RateLimit: llm.RateLimit{Known: true, Limit: 60, Remaining: 0, ResetAt: testNow.Add(750 * time.Millisecond), ResetGranularity: time.Millisecond}},
			wantType: "rate_limit_exceeded",
			header:   map[string]string{"Retry-After-Ms": "750"},
		},
		{
			name: "Anthropic529", kind: llm.KindAnthropic,
			handler:  reply(529, `{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}`),
			want:     llm.StatusError{StatusCode: 529, Type: "overloaded_error", Message: "Overloaded"},
			wantType: "overloaded_error",
		},
		{
			name: "503PlainText", kind: llm.KindOpenAI,
			handler: reply(503, "upstream connect error or disconnect/reset before headers.\n  reset reason: overflow", "Content-Type", "text/plain"),
			want:    llm.StatusError{StatusCode: 503, Message: "upstream connect error or disconnect/reset before headers. reset reason: overflow"},
		},
		{
			name: "503Empty", kind: llm.KindAnthropic,
			handler: reply(503, ""),
			want:    llm.StatusError{StatusCode: 503, Message: "Service Unavailable"},
		},
		{
			name: "500ShouldRetryFalse", kind: llm.KindAnthropic,
			handler:  reply(500, `{"type":"error","error":{"type":"api_error","message":"Internal server error"}}`, "X-Should-Retry", "false"),
			want:     llm.StatusError{StatusCode: 500, Type: "api_error", Message: "Internal server error"},
			wantType: "api_error",
			header:   map[string]string{"X-Should-Retry": "false"},
		},
		{
			name: "ErrorAsString", kind: llm.KindOpenAI,
			handler: reply(404, `{"error":"model not found"}`),
			want:    llm.StatusError{StatusCode: 404, Message: "model not found"},
		},
		{
			name: "NumericCode", kind: llm.KindOpenAI,
			handler:  reply(400, `{"error":{"message":"bad","type":"invalid_request_error","code":1234}}`),
			want:     llm.StatusError{StatusCode: 400, Type: "invalid_request_error", Code: "1234", Message: "bad"},
			wantType: "1234",
		},
		{
			name: "KeyEchoedIsRedacted", kind: llm.KindOpenAI,
			handler:  reply(401, `{"error":{"message":"Incorrect API key provided: `+testKey+`.","type":"invalid_request_error","param":null,"code":"invalid_api_key"}}`),
			want:     llm.StatusError{StatusCode: 401, Type: "invalid_request_error", Code: "invalid_api_key", Message: "Incorrect API key provided: [redacted]."},
			wantType: "invalid_api_key",
		},
		{
			name: "ControlCharactersReplaced", kind: llm.KindOpenAI,
			handler:  reply(500, `{"error":{"message":"a\u0000b\u001b[2Jc\td\ne\u009b","type":"x\u0007"}}`),
			want:     llm.StatusError{StatusCode: 500, Type: "x\uFFFD", Message: "a\uFFFDb\uFFFD[2Jc\td\ne\uFFFD"},
			wantType: "x\uFFFD",
		},
		{
			name: "CRLFTextOnOneLine", kind: llm.KindOpenAI,
			handler: reply(502, "<html>\r\n<body>bad gateway</body>\r\n</html>\r\n", "Content-Type", "text/html"),
			want:    llm.StatusError{StatusCode: 502, Message: "<html> <body>bad gateway</body> </html>"},
		},
		{
			name: "InvalidUTF8InTextReplaced", kind: llm.KindOpenAI,
			handler: reply(502, "bad\xffgate\x00way", "Content-Type", "text/plain"),
			want:    llm.StatusError{StatusCode: 502, Message: "bad\uFFFDgate\uFFFDway"},
		},
		{
			name: "KeyEchoedInTextIsRedacted", kind: llm.KindAnthropic,
			handler: reply(403, "<html>denied for key "+testKey+"</html>", "Content-Type", "text/html"),
			want:    llm.StatusError{StatusCode: 403, Message: "<html>denied for key [redacted]</html>"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()

			b := setup(t, tt.kind, tt.handler, bundleOpts{now: fixedClock})
			resp, err := b.provider.Send(t.Context(), bodyFor(tt.kind), llm.SendOptions{})
			require.Nil(t, resp)
			requireNoSecret(t, err)
			se := asStatusError(t, err)

			got := *se
			got.Header, got.Latency, got.TimeToFirstByte = nil, 0, 0
			require.Equal(t, tt.want, got)
			require.Equal(t, tt.want.StatusCode, se.HTTPStatus())
			require.Equal(t, tt.wantType, se.ErrorType())
			require.Equal(t, se.Header, se.ResponseHeader())
			for k, v := range tt.header {
				require.Equal(t, v, se.ResponseHeader().Get(k), k)
			}
			require.Contains(t, se.Error(), "provider answered")
		})
	}

	t.Run("LongBodyExcerptIsShort", func(t *testing.T) {
		t.Parallel()

		long := "<html>" + strings.Repeat("é bad gateway ", 10_000) + "</html>"
		b := setup(t, llm.KindAnthropic, reply(502, long, "Content-Type", "text/html"))
		_, err := b.provider.Send(t.Context(), bodyFor(llm.KindAnthropic), llm.SendOptions{})
		se := asStatusError(t, err)
		require.Equal(t, 502, se.StatusCode)
		require.True(t, strings.HasPrefix(se.Message, "<html>é bad gateway"), se.Message)
		require.LessOrEqual(t, len(se.Message), 210)
		require.True(t, utf8.ValidString(se.Message), "message stays valid UTF-8")
	})

	t.Run("LongProviderMessageTruncated", func(t *testing.T) {
		t.Parallel()

		msg := strings.Repeat("x", 5000)
		b := setup(t, llm.KindAnthropic, reply(400, `{"type":"error","error":{"type":"invalid_request_error","message":"`+msg+`"}}`))
		_, err := b.provider.Send(t.Context(), bodyFor(llm.KindAnthropic), llm.SendOptions{})
		se := asStatusError(t, err)
		require.Less(t, len(se.Message), 600)
		require.Less(t, len(err.Error()), 700)
	})
}

func TestProvider_Send_RateLimit(t *testing.T) {
	t.Parallel()

	tests := []struct {
		name string
		kind llm.Kind
		kv   []string
		want llm.RateLimit
	}{
		{"AnthropicFull", llm.KindAnthropic, []string{"Anthropic-Ratelimit-Requests-Limit", "50", "Anthropic-Ratelimit-Requests-Remaining", "49", "Anthropic-Ratelimit-Requests-Reset", "2026-03-01T12:00:30Z"},
			llm.RateLimit{Known: true, Limit: 50, Remaining: 49, ResetAt: testNow.Add(30 * time.Second), ResetAbsolute: true}},
		{"AnthropicFractional", llm.KindAnthropic, []string{"anthropic-ratelimit-requests-limit", "4000", "anthropic-ratelimit-requests-remaining", "3999", "anthropic-ratelimit-requests-reset", "2026-03-01T12:00:00.250Z"},
			llm.RateLimit{Known: true, Limit: 4000, Remaining: 3999, ResetAt: testNow.Add(250 * time.Millisecond), ResetAbsolute: true}},
		{"AnthropicOffset", llm.KindAnthropic, []string{"Anthropic-Ratelimit-Requests-Limit", "50", "Anthropic-Ratelimit-Requests-Remaining", "0", "Anthropic-Ratelimit-Requests-Reset", "2026-03-01T14:00:01+02:00"},
			llm.RateLimit{Known: true, Limit: 50, Remaining: 0, ResetAt: testNow.Add(time.Second), ResetAbsolute: true}},
		{"AnthropicGarbageReset", llm.KindAnthropic, []string{"Anthropic-Ratelimit-Requests-Limit", "50", "Anthropic-Ratelimit-Requests-Remaining", "10", "Anthropic-Ratelimit-Requests-Reset", "soon"},
			llm.RateLimit{Known: true, Limit: 50, Remaining: 10}},
		{"AnthropicMissingRemaining", llm.KindAnthropic, []string{"Anthropic-Ratelimit-Requests-Limit", "50"}, llm.RateLimit{}},
		{"AnthropicNegative", llm.KindAnthropic, []string{"Anthropic-Ratelimit-Requests-Limit", "-1", "Anthropic-Ratelimit-Requests-Remaining", "0"}, llm.RateLimit{}},
		{"AnthropicIgnoresOpenAIHeaders", llm.KindAnthropic, []string{"X-Ratelimit-Limit-Requests", "60", "X-Ratelimit-Remaining-Requests", "59"}, llm.RateLimit{}},
		{"OpenAISeconds", llm.KindOpenAI, []string{"X-Ratelimit-Limit-Requests", "5000", "X-Ratelimit-Remaining-Requests", "4999", "X-Ratelimit-Reset-Requests", "1s"},
			llm.RateLimit{Known: true, Limit: 5000, Remaining: 4999, ResetAt: testNow.Add(time.Second), ResetGranularity: time.Second}},
		{"OpenAIMinutes", llm.KindOpenAI, []string{"X-Ratelimit-Limit-Requests", "60", "X-Ratelimit-Remaining-Requests", "0", "X-Ratelimit-Reset-Requests", "6m0s"},
			llm.RateLimit{Known: true, Limit: 60, Remaining: 0, ResetAt: testNow.Add(6 * time.Minute), ResetGranularity: time.Second}},
		{"OpenAIMillis", llm.KindOpenAI, []string{"x-ratelimit-limit-requests", "60", "x-ratelimit-remaining-requests", "3", "x-ratelimit-reset-requests", "120ms"},
			llm.RateLimit{Known: true, Limit: 60, Remaining: 3, ResetAt: testNow.Add(120 * time.Millisecond), ResetGranularity: time.Millisecond}},
		{"OpenAIFractional", llm.KindOpenAI, []string{"X-Ratelimit-Limit-Requests", "60", "X-Ratelimit-Remaining-Requests", "3", "X-Ratelimit-Reset-Requests", "1.5s"},
			llm.RateLimit{Known: true, Limit: 60, Remaining: 3, ResetAt: testNow.Add(1500 * time.Millisecond), ResetGranularity: time.Millisecond}},
		{"OpenAICompound", llm.KindOpenAI, []string{"X-Ratelimit-Limit-Requests", "60", "X-Ratelimit-Remaining-Requests", "3", "X-Ratelimit-Reset-Requests", "1h2m3.5s"},
			llm.RateLimit{Known: true, Limit: 60, Remaining: 3, ResetAt: testNow.Add(time.Hour + 2*time.Minute + 3500*time.Millisecond), ResetGranularity: time.Millisecond}},
		{"OpenAIGarbageReset", llm.KindOpenAI, []string{"X-Ratelimit-Limit-Requests", "60", "X-Ratelimit-Remaining-Requests", "3", "X-Ratelimit-Reset-Requests", "soon"},
			llm.RateLimit{Known: true, Limit: 60, Remaining: 3}},
		{"OpenAINegativeReset", llm.KindOpenAI, []string{"X-Ratelimit-Limit-Requests", "60", "X-Ratelimit-Remaining-Requests", "3", "X-Ratelimit-Reset-Requests", "-1s"},
			llm.RateLimit{Known: true, Limit: 60, Remaining: 3}},
		{"OpenAIGarbageLimit", llm.KindOpenAI, []string{"X-Ratelimit-Limit-Requests", "many", "X-Ratelimit-Remaining-Requests", "3"}, llm.RateLimit{}},
		{"OpenAIIgnoresAnthropicHeaders", llm.KindOpenAI, []string{"Anthropic-Ratelimit-Requests-Limit", "50", "Anthropic-Ratelimit-Requests-Remaining", "49"}, llm.RateLimit{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()

			b := setup(t, tt.kind, reply(200, `{}`, tt.kv...), bundleOpts{now: fixedClock})
			resp, err := b.provider.Send(t.Context(), bodyFor(tt.kind), llm.SendOptions{})
			require.NoError(t, err)
			require.Equal(t, tt.want.Known, resp.RateLimit.Known)
			require.Equal(t, tt.want.Limit, resp.RateLimit.Limit)
			require.Equal(t, tt.want.Remaining, resp.RateLimit.Remaining)
			require.True(t, tt.want.ResetAt.Equal(resp.RateLimit.ResetAt), "ResetAt: want %v, got %v", tt.want.ResetAt, resp.RateLimit.ResetAt)
			require.Equal(t, tt.want.ResetAbsolute, resp.RateLimit.ResetAbsolute)
			require.Equal(t, tt.want.ResetGranularity, resp.RateLimit.ResetGranularity)
		})
	}
}

func TestProvider_Send_TimeToFirstByte(t *testing.T) {
	t.Parallel()

	const delay = time.Second

	t.Run("HeadersEarlyBodyLate", func(t *testing.T) {
		t.Parallel()

		b := setup(t, llm.KindAnthropic, func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(200)
			w.(http.Flusher).Flush()
			select { // a provider that sends headers at once and generates for a while
			case <-time.After(delay):
			case <-r.Context().Done():
				return
			}
			_, _ = io.WriteString(w, `{"usage":{"input_tokens":1,"output_tokens":1}}`)
		})
		resp, err := b.provider.Send(t.Context(), bodyFor(llm.KindAnthropic), llm.SendOptions{})
		require.NoError(t, err)
		require.GreaterOrEqual(t, resp.TimeToFirstByte, delay, "TTFB measures the first body byte, not the headers")
		require.GreaterOrEqual(t, resp.Latency, resp.TimeToFirstByte)
	})

	t.Run("FirstByteTimeoutAbortsASilentGeneration", func(t *testing.T) {
		t.Parallel()

		gone := make(chan struct{})
		b := setup(t, llm.KindAnthropic, func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(200)
			w.(http.Flusher).Flush()
			<-r.Context().Done() // headers at once, then nothing: only the timeout ends this
			close(gone)
		})
		_, err := b.provider.Send(callContext(t), bodyFor(llm.KindAnthropic), llm.SendOptions{FirstByteTimeout: 50 * time.Millisecond})
		require.ErrorIs(t, err, llm.ErrFirstByteTimeout)
		var te *llm.TransportError
		require.ErrorAs(t, err, &te)
		require.True(t, te.Timeout())
		require.NotErrorIs(t, err, context.Canceled)
		within(t, gone, "abort seen by the server")
	})

	t.Run("FirstByteTimeoutStopsOnceTheBodyStarts", func(t *testing.T) {
		t.Parallel()

		// A long generation after the first byte is not a first-byte timeout.
		b := setup(t, llm.KindAnthropic, pausedBody(delay))
		// The first byte comes at once and the rest after delay: a first-byte limit of half of it
		// leaves the first byte room on a loaded machine and still ends well before the rest.
		resp, err := b.provider.Send(t.Context(), bodyFor(llm.KindAnthropic), llm.SendOptions{FirstByteTimeout: delay / 2})
		require.NoError(t, err)
		require.Equal(t, 1, resp.Usage.OutputTokens)
	})

	t.Run("EmptyBodyTTFBIsLatency", func(t *testing.T) {
		t.Parallel()

		b := setup(t, llm.KindAnthropic, reply(503, ""), bundleOpts{now: steppingClock(time.Millisecond)})
		_, err := b.provider.Send(t.Context(), bodyFor(llm.KindAnthropic), llm.SendOptions{})
		se := asStatusError(t, err)
		require.Positive(t, se.Latency)
		require.Equal(t, se.Latency, se.TimeToFirstByte)
	})

	t.Run("StatusErrorCarriesTimings", func(t *testing.T) {
		t.Parallel()

		b := setup(t, llm.KindAnthropic, reply(500, `{"type":"error","error":{"type":"api_error","message":"x"}}`), bundleOpts{now: steppingClock(time.Millisecond)})
		_, err := b.provider.Send(t.Context(), bodyFor(llm.KindAnthropic), llm.SendOptions{})
		se := asStatusError(t, err)
		require.Positive(t, se.TimeToFirstByte)
		require.Less(t, se.TimeToFirstByte, se.Latency)
	})

	// A body (not streamed) cut after its first byte came, short of its Content-Length or (framed
	// by the connection's close) short of its JSON's end, had no TimeToFirstByte: the attempt's
	// ttfb_ms read null, as if no byte had come, though the provider had begun to answer. The
	// clock steps a second a reading: the request sent (1), its headers (2), the first byte (3).
	for name, raw := range map[string]string{
		"CutShortKeepsIt":          "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{\"id\":\"msg_",
		"CutCloseDelimitedKeepsIt": "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n\r\n{\"id\":\"msg_",
		"CutBeforeAnyByteHasNone":  "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n",
	} {
		t.Run("Body"+name, func(t *testing.T) {
			t.Parallel()

			b := setup(t, llm.KindAnthropic, func(w http.ResponseWriter, r *http.Request) {
				_, _ = io.Copy(io.Discard, r.Body)
				conn, buf, err := http.NewResponseController(w).Hijack()
				if err != nil {
					return
				}
				_, _ = buf.WriteString(raw)
				_ = buf.Flush()
				_ = conn.Close()
			}, bundleOpts{now: steppingClock(time.Second)})
			_, err := b.provider.Send(callContext(t), bodyFor(llm.KindAnthropic), llm.SendOptions{})
			te := asTransportError(t, err)
			require.Equal(t, "read response body", te.Op)
			require.Equal(t, http.StatusOK, te.StatusCode)
			if strings.HasSuffix(name, "HasNone") {
				require.Zero(t, te.TimeToFirstByte, "no body byte came")
				return
			}
			require.Equal(t, 2*time.Second, te.TimeToFirstByte, "the body's first byte came")
		})
	}
}

func TestProvider_Send_InvalidRequest(t *testing.T) {
	t.Parallel()

	var hits atomic.Int64
	b := setup(t, llm.KindOpenAI, func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		reply(200, `{}`)(w, r)
	})
	for _, body := range []string{"", " ", "null", "[]", `"text"`, "42", "{", `{"a":1} trailing`} {
		_, err := b.provider.Send(t.Context(), []byte(body), llm.SendOptions{})
		require.ErrorIs(t, err, llm.ErrInvalidRequest, "body %q", body)
	}
	require.Zero(t, hits.Load(), "an invalid request is never sent")

	_, err := b.provider.Send(t.Context(), []byte(`{"stream":false,"model":"m"}`), llm.SendOptions{})
	require.NoError(t, err)
	require.Equal(t, int64(1), hits.Load())
}

func TestProvider_Send_Decode(t *testing.T) {
	t.Parallel()

	for _, body := range []string{"<html>hello</html>", "[1,2]", "null", `{"usage":`, "", `{"usage":{}} trailing`, `{"content":[]}{}`} {
		t.Run(body, func(t *testing.T) {
			t.Parallel()

			b := setup(t, llm.KindAnthropic, reply(200, body, "Content-Type", "text/html"))
			resp, err := b.provider.Send(t.Context(), bodyFor(llm.KindAnthropic), llm.SendOptions{})
			require.ErrorIs(t, err, llm.ErrDecode)
			requireNoSecret(t, err)
			require.NotNil(t, resp, "the response is returned with a decode error so the attempt can be recorded")
			require.Equal(t, 200, resp.StatusCode)
			require.Equal(t, body, string(resp.Body))
		})
	}

	t.Run("UsageWithWrongTypesIsZero", func(t *testing.T) {
		t.Parallel()

		b := setup(t, llm.KindOpenAI, reply(200, `{"usage":{"prompt_tokens":"many"}}`))
		resp, err := b.provider.Send(t.Context(), bodyFor(llm.KindOpenAI), llm.SendOptions{})
		require.NoError(t, err)
		require.Equal(t, llm.Usage{}, resp.Usage)
	})

	t.Run("TooLarge", func(t *testing.T) {
		t.Parallel()

		b := setup(t, llm.KindAnthropic, reply(200, `{"content":"`+strings.Repeat("a", 100)+`"}`), bundleOpts{maxBytes: 64})
		resp, err := b.provider.Send(t.Context(), bodyFor(llm.KindAnthropic), llm.SendOptions{})
		require.ErrorIs(t, err, llm.ErrResponseTooLarge)
		require.ErrorIs(t, err, llm.ErrDecode)
		require.ErrorContains(t, err, "limit 64 bytes")
		require.NotNil(t, resp)
		require.Nil(t, resp.Body)

		b = setup(t, llm.KindAnthropic, reply(200, `{"content":"`+strings.Repeat("a", 50)+`"}`), bundleOpts{maxBytes: 64})
		_, err = b.provider.Send(t.Context(), bodyFor(llm.KindAnthropic), llm.SendOptions{})
		require.NoError(t, err, "a body within the limit is fine")
	})
}

func TestProvider_Send_NoRedirect(t *testing.T) {
	t.Parallel()

	var leaked atomic.Value
	target := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		leaked.Store(r.Header.Get("X-Api-Key"))
		reply(200, `{}`)(w, r)
	}))
	t.Cleanup(target.Close)
	b := setup(t, llm.KindAnthropic, func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, target.URL+"/v1/messages", http.StatusTemporaryRedirect)
	})
	_, err := b.provider.Send(t.Context(), bodyFor(llm.KindAnthropic), llm.SendOptions{})
	se := asStatusError(t, err)
	require.Equal(t, http.StatusTemporaryRedirect, se.StatusCode)
	require.Nil(t, leaked.Load(), "the redirect target must not be contacted")
}

func TestProvider_Send_DefaultHTTPClient(t *testing.T) {
	t.Parallel()

	srv := httptest.NewServer(reply(200, `{"usage":{"input_tokens":3,"output_tokens":4}}`))
	t.Cleanup(srv.Close)
	p, err := llm.New(llm.Config{Kind: llm.KindAnthropic, BaseURL: srv.URL, APIKey: testKey})
	require.NoError(t, err)
	resp, err := p.Send(t.Context(), bodyFor(llm.KindAnthropic), llm.SendOptions{})
	require.NoError(t, err)
	require.Equal(t, llm.Usage{InputTokens: 3, OutputTokens: 4}, resp.Usage)
}

func TestProvider_Send_Transport(t *testing.T) {
	t.Parallel()

	t.Run("ServerClosed", func(t *testing.T) {
		t.Parallel()

		srv := httptest.NewServer(reply(200, `{}`))
		url := srv.URL
		srv.Close()
		p, err := llm.New(llm.Config{Kind: llm.KindOpenAI, BaseURL: url, APIKey: testKey})
		require.NoError(t, err)
		_, err = p.Send(t.Context(), bodyFor(llm.KindOpenAI), llm.SendOptions{})
		requireNoSecret(t, err)
		te := asTransportError(t, err)
		require.Equal(t, "send request", te.Op)
		require.False(t, te.Timeout())
		require.Zero(t, te.StatusCode, "no answer came")
		require.NotErrorIs(t, err, context.Canceled)
	})

	t.Run("ConnectionReset", func(t *testing.T) {
		t.Parallel()

		b := setup(t, llm.KindAnthropic, func(w http.ResponseWriter, _ *http.Request) {
			conn, _, err := http.NewResponseController(w).Hijack()
			if err != nil {
				return
			}
			if tc, ok := conn.(interface{ SetLinger(int) error }); ok {
				_ = tc.SetLinger(0) // close with RST
			}
			_ = conn.Close()
		})
		_, err := b.provider.Send(t.Context(), bodyFor(llm.KindAnthropic), llm.SendOptions{})
		requireNoSecret(t, err)
		te := asTransportError(t, err)
		require.Equal(t, "send request", te.Op)
		require.False(t, te.Timeout())
	})

	t.Run("BodyCutShort", func(t *testing.T) {
		t.Parallel()

		// The part of the body is flushed before the hijack: a hijack sends the headers but
		// drops what the handler's buffered writer holds, so the body was cut before its first
		// byte.
		b := setup(t, llm.KindAnthropic, func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Length", "1000")
			w.WriteHeader(200)
			_, _ = io.WriteString(w, `{"id":"msg_`)
			rc := http.NewResponseController(w)
			if rc.Flush() != nil {
				return
			}
			conn, _, err := rc.Hijack()
			if err != nil {
				return
			}
			_ = conn.Close()
		})
		_, err := b.provider.Send(t.Context(), bodyFor(llm.KindAnthropic), llm.SendOptions{})
		requireNoSecret(t, err)
		te := asTransportError(t, err)
		require.Equal(t, "read response body", te.Op)
		require.ErrorIs(t, err, io.ErrUnexpectedEOF)
		require.False(t, te.Timeout())
		require.Equal(t, http.StatusOK, te.StatusCode, "the headers came: the provider answered")
		require.Positive(t, te.TimeToFirstByte, "the body's first bytes came: the provider had begun to answer")
	})
}

// blockingServer answers nothing (or only headers and part of a body) until the client
// goes away, and reports that it saw the client go away. ready is closed when the server
// holds the request (before headers) or when the client holds the headers (mid-body).
func blockingServer(t *testing.T, kind llm.Kind, partial bool) (b *testBundle, ready, aborted chan struct{}) {
	t.Helper()

	arrived, gotHeaders, aborted := make(chan struct{}), make(chan struct{}), make(chan struct{})
	opts := bundleOpts{wrap: func(rt http.RoundTripper) http.RoundTripper {
		return roundTripFunc(func(r *http.Request) (*http.Response, error) {
			resp, err := rt.RoundTrip(r)
			close(gotHeaders)
			return resp, err
		})
	}}
	b = setup(t, kind, func(w http.ResponseWriter, r *http.Request) {
		// An HTTP/1.1 server notices a client hang-up only once the request body is read.
		_, _ = io.Copy(io.Discard, r.Body)
		if partial {
			w.Header().Set("Content-Length", "1000")
			w.WriteHeader(200)
			_, _ = io.WriteString(w, `{"id":`)
			w.(http.Flusher).Flush()
		}
		close(arrived)
		<-r.Context().Done()
		close(aborted)
	}, opts)
	if partial {
		return b, gotHeaders, aborted
	}
	return b, arrived, aborted
}

func requireAborted(t *testing.T, aborted chan struct{}) {
	t.Helper()
	select {
	case <-aborted:
	case <-time.After(30 * time.Second):
		t.Fatal("the provider never saw the request aborted")
	}
}

func TestProvider_Send_Context(t *testing.T) {
	t.Parallel()

	for _, partial := range []bool{false, true} {
		name := map[bool]string{false: "BeforeHeaders", true: "MidBody"}[partial]
		wantOp := map[bool]string{false: "send request", true: "read response body"}[partial]

		t.Run("Canceled"+name, func(t *testing.T) {
			t.Parallel()

			b, ready, aborted := blockingServer(t, llm.KindAnthropic, partial)
			ctx, cancel := context.WithCancel(callContext(t))
			defer cancel()
			errc := make(chan error, 1)
			go func() {
				_, err := b.provider.Send(ctx, bodyFor(llm.KindAnthropic), llm.SendOptions{})
				errc <- err
			}()
			within(t, ready, "request at the server")
			cancel()
			err := within(t, errc, "end of the canceled call")
			require.ErrorIs(t, err, context.Canceled)
			requireNoSecret(t, err)
			te := asTransportError(t, err)
			require.Equal(t, wantOp, te.Op)
			require.False(t, te.Timeout())
			require.Equal(t, map[bool]int{false: 0, true: http.StatusOK}[partial], te.StatusCode, "the answer's status, when its headers came")
			requireAborted(t, aborted)
		})

		t.Run("Deadline"+name, func(t *testing.T) {
			t.Parallel()

			b, _, aborted := blockingServer(t, llm.KindOpenAI, partial)
			ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
			defer cancel()
			_, err := b.provider.Send(ctx, bodyFor(llm.KindOpenAI), llm.SendOptions{})
			require.ErrorIs(t, err, context.DeadlineExceeded)
			require.NotErrorIs(t, err, context.Canceled)
			requireNoSecret(t, err)
			// Which operation the deadline interrupts depends on timing; the Canceled
			// cases pin the operation down.
			te := asTransportError(t, err)
			require.True(t, te.Timeout())
			requireAborted(t, aborted)
		})
	}

	t.Run("AlreadyCanceled", func(t *testing.T) {
		t.Parallel()

		var hits atomic.Int64
		b := setup(t, llm.KindAnthropic, func(w http.ResponseWriter, r *http.Request) {
			hits.Add(1)
			reply(200, `{}`)(w, r)
		})
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		_, err := b.provider.Send(ctx, bodyFor(llm.KindAnthropic), llm.SendOptions{})
		require.ErrorIs(t, err, context.Canceled)
		require.Zero(t, hits.Load())
	})
}

func TestTransportError(t *testing.T) {
	t.Parallel()

	inner := errors.New("connection refused")
	te := &llm.TransportError{Op: "send request", Err: inner}
	require.Equal(t, "llm: send request: connection refused", te.Error())
	require.ErrorIs(t, te, inner)
	require.False(t, te.Timeout())
	require.True(t, (&llm.TransportError{Op: "x", Err: context.DeadlineExceeded}).Timeout())
	require.False(t, (&llm.TransportError{Op: "x", Err: context.Canceled}).Timeout())
}
