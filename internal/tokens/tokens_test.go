package tokens_test

import (
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/tokens"
)

func TestCount(t *testing.T) {
	t.Parallel()
	text := strings.Repeat("x", 8000) // 2,000 tokens
	for _, tc := range []struct {
		name     string
		provider string
		body     string
		want     tokens.Request
	}{
		{
			name: "AnthropicString", provider: tokens.ProviderAnthropic,
			body: `{"model":"claude-x","max_tokens":200,"messages":[{"role":"user","content":"` + text + `"}]}`,
			want: tokens.Request{Model: "claude-x", TextBytes: 8000, Input: 2000, MaxOutput: 200},
		},
		{
			// blocks are joined by a newline; non-text blocks count nothing; system counts
			name: "AnthropicBlocksAndSystem", provider: tokens.ProviderAnthropic,
			body: `{"model":"m","max_tokens":5,"system":[{"type":"text","text":"abc"}],"messages":[
				{"role":"user","content":[{"type":"text","text":"hello"},{"type":"image","source":{}},{"type":"text","text":"world"}]},
				{"role":"assistant","content":"ok"}]}`,
			want: tokens.Request{Model: "m", TextBytes: 3 + 11 + 2, Input: 4, MaxOutput: 5},
		},
		{
			name: "AnthropicSystemString", provider: tokens.ProviderAnthropic,
			body: `{"model":"m","max_tokens":5,"system":"12345678","messages":[{"role":"user","content":"1234"}]}`,
			want: tokens.Request{Model: "m", TextBytes: 12, Input: 3, MaxOutput: 5},
		},
		{
			// OpenAI's system prompt is a message; a top-level "system" is not its API
			name: "OpenAI", provider: tokens.ProviderOpenAI,
			body: `{"model":"gpt-x","max_tokens":100,"system":"ignored","messages":[{"role":"system","content":"12345678"},
				{"role":"user","content":[{"type":"text","text":"1234"}]},{"role":"assistant","content":null}]}`,
			want: tokens.Request{Model: "gpt-x", TextBytes: 12, Input: 3, MaxOutput: 100},
		},
		{
			name: "OpenAIMaxCompletionTokensWins", provider: tokens.ProviderOpenAI,
			body: `{"model":"o","max_tokens":100,"max_completion_tokens":300,"messages":[{"role":"user","content":"hi"}]}`,
			want: tokens.Request{Model: "o", TextBytes: 2, Input: 1, MaxOutput: 300},
		},
		{
			name: "DefaultMaxOutputAndAtLeastOneToken", provider: tokens.ProviderOpenAI,
			body: `{"model":"o","messages":[{"role":"user","content":""}]}`,
			want: tokens.Request{Model: "o", Input: 1, MaxOutput: tokens.DefaultMaxOutput},
		},
		{
			name: "UTF8Bytes", provider: tokens.ProviderAnthropic,
			body: `{"model":"m","max_tokens":1,"messages":[{"role":"user","content":"héllo wörld"}]}`,
			want: tokens.Request{Model: "m", TextBytes: 13, Input: 3, MaxOutput: 1},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got, err := tokens.Count(tc.provider, []byte(tc.body))
			require.NoError(t, err)
			require.Equal(t, tc.want, got)
		})
	}

	t.Run("Errors", func(t *testing.T) {
		t.Parallel()
		for _, body := range []string{
			`[1]`, `not json`,
			`{"messages":{"role":"user"}}`,
			`{"messages":[{"role":"user","content":42}]}`,
			`{"system":42,"messages":[]}`,
			`{"max_tokens":0,"messages":[]}`,
			`{"max_tokens":"many","messages":[]}`,
			`{"max_tokens":1.5,"messages":[]}`,
		} {
			_, err := tokens.Count(tokens.ProviderAnthropic, []byte(body))
			require.ErrorIs(t, err, tokens.ErrInvalidRequest, body)
		}
		_, err := tokens.Count("gemini", []byte(`{}`))
		require.ErrorContains(t, err, "unknown provider")
	})
}

func body(textBytes int, model string) []byte {
	return []byte(fmt.Sprintf(`{"model":%q,"max_tokens":200,"messages":[{"role":"user","content":%q}]}`,
		model, strings.Repeat("y", textBytes)))
}

func TestEstimator(t *testing.T) {
	t.Parallel()

	t.Run("ConservativeThenExact", func(t *testing.T) {
		t.Parallel()
		reg := prometheus.NewRegistry()
		e, err := tokens.New(&tokens.Config{Metrics: tokens.NewMetrics(reg)})
		require.NoError(t, err)
		est, err := e.Estimate("main", tokens.ProviderAnthropic, body(8000, "claude"))
		require.NoError(t, err)
		require.Equal(t, tokens.Estimate{Model: "claude", Raw: 2000, Ratio: 1.25, Input: 2500, MaxOutput: 200}, est)
		// The provider counted exactly the rule (as cmd/llmsim does): from now on, exact.
		e.Observe("main", est, 2000)
		est, err = e.Estimate("main", tokens.ProviderAnthropic, body(8000, "claude"))
		require.NoError(t, err)
		require.Equal(t, 1.0, est.Ratio)
		require.Equal(t, 2000, est.Input)
		// Other credentials and models start conservative.
		require.Equal(t, 1.25, e.Ratio("other", "claude"))
		require.Equal(t, 1.25, e.Ratio("main", "haiku"))

		mfs, err := reg.Gather()
		require.NoError(t, err)
		require.Len(t, mfs, 1)
		require.Equal(t, "llmq_tokens_estimate_ratio", mfs[0].GetName())
		h := mfs[0].GetMetric()[0].GetHistogram()
		require.Equal(t, uint64(1), h.GetSampleCount())
		require.InDelta(t, 1.25, h.GetSampleSum(), 1e-12)
	})

	t.Run("MovingAverageConverges", func(t *testing.T) {
		t.Parallel()
		e, err := tokens.New(nil)
		require.NoError(t, err)
		est := tokens.Estimate{Model: "gpt", Raw: 1000}
		e.Observe("k", est, 1000) // ratio 1
		// The provider now counts 50% more (say, tool definitions the rule ignores).
		e.Observe("k", est, 1500)
		require.InDelta(t, 1.1, e.Ratio("k", "gpt"), 1e-12)
		for range 30 {
			e.Observe("k", est, 1500)
		}
		require.InDelta(t, 1.5, e.Ratio("k", "gpt"), 0.001)
		got, err := e.Estimate("k", tokens.ProviderOpenAI, body(4000, "gpt"))
		require.NoError(t, err)
		require.InDelta(t, 1500, got.Input, 2)
		// No usage, nothing learned.
		e.Observe("k", est, 0)
		require.InDelta(t, 1.5, e.Ratio("k", "gpt"), 0.001)
	})

	t.Run("Clamped", func(t *testing.T) {
		t.Parallel()
		e, err := tokens.New(&tokens.Config{MinRatio: 0.5, MaxRatio: 2})
		require.NoError(t, err)
		e.Observe("k", tokens.Estimate{Model: "a", Raw: 10}, 1000)
		require.Equal(t, 2.0, e.Ratio("k", "a"))
		e.Observe("k", tokens.Estimate{Model: "b", Raw: 1000}, 1)
		require.Equal(t, 0.5, e.Ratio("k", "b"))
	})

	t.Run("MaxEntries", func(t *testing.T) {
		t.Parallel()
		e, err := tokens.New(&tokens.Config{MaxEntries: 2})
		require.NoError(t, err)
		for _, m := range []string{"a", "b", "c"} {
			e.Observe("k", tokens.Estimate{Model: m, Raw: 10}, 20)
		}
		learned := 0
		for _, m := range []string{"a", "b", "c"} {
			if e.Ratio("k", m) == 2 {
				learned++
			}
		}
		require.Equal(t, 2, learned)
		require.Equal(t, 2.0, e.Ratio("k", "c"))
	})

	t.Run("Concurrent", func(t *testing.T) {
		t.Parallel()
		e, err := tokens.New(nil)
		require.NoError(t, err)
		var wg sync.WaitGroup
		for g := range 8 {
			wg.Go(func() {
				for range 200 {
					est, err := e.Estimate(fmt.Sprint("c", g%2), tokens.ProviderOpenAI, body(400, "m"))
					if err != nil {
						t.Error(err)
						return
					}
					e.Observe(fmt.Sprint("c", g%2), est, 120)
				}
			})
		}
		wg.Wait()
		require.InDelta(t, 1.2, e.Ratio("c0", "m"), 1e-9)
		require.InDelta(t, 1.2, e.Ratio("c1", "m"), 1e-9)
	})

	t.Run("InvalidConfig", func(t *testing.T) {
		t.Parallel()
		for _, tc := range []struct {
			cfg   tokens.Config
			field string
		}{
			{tokens.Config{MinRatio: 2, MaxRatio: 1}, "MinRatio"},
			{tokens.Config{InitialRatio: 10}, "InitialRatio"},
			{tokens.Config{Alpha: 2}, "Alpha"},
			{tokens.Config{Alpha: -1}, "Alpha"},
			{tokens.Config{MaxEntries: -1}, "MaxEntries"},
		} {
			_, err := tokens.New(&tc.cfg)
			require.ErrorContains(t, err, tc.field)
		}
	})
}
