package estimator_test

import (
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/estimator"
	"github.com/llmq/llmq/internal/tokens"
)

func TestEstimator(t *testing.T) {
	t.Parallel()

	t.Run("ConservativeThenExact", func(t *testing.T) {
		t.Parallel()
		reg := prometheus.NewRegistry()
		e, err := estimator.New(&estimator.Config{Metrics: estimator.NewMetrics(reg)})
		require.NoError(t, err)
		est, err := e.Estimate("main", tokens.ProviderAnthropic, body(8000, "claude"))
		require.NoError(t, err)
		require.Equal(t, estimator.Estimate{Model: "claude", Raw: 2000, Ratio: 1.25, Input: 2500, MaxOutput: 200}, est)
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
		e, err := estimator.New(nil)
		require.NoError(t, err)
		est := estimator.Estimate{Model: "gpt", Raw: 1000}
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
		e, err := estimator.New(&estimator.Config{MinRatio: 0.5, MaxRatio: 2})
		require.NoError(t, err)
		e.Observe("k", estimator.Estimate{Model: "a", Raw: 10}, 1000)
		require.Equal(t, 2.0, e.Ratio("k", "a"))
		e.Observe("k", estimator.Estimate{Model: "b", Raw: 1000}, 1)
		require.Equal(t, 0.5, e.Ratio("k", "b"))
	})

	t.Run("MaxEntries", func(t *testing.T) {
		t.Parallel()
		e, err := estimator.New(&estimator.Config{MaxEntries: 2})
		require.NoError(t, err)
		for _, m := range []string{"a", "b", "c"} {
			e.Observe("k", estimator.Estimate{Model: m, Raw: 10}, 20)
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
		e, err := estimator.New(nil)
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
			cfg   estimator.Config
			field string
		}{
			{estimator.Config{MinRatio: 2, MaxRatio: 1}, "MinRatio"},
			{estimator.Config{InitialRatio: 10}, "InitialRatio"},
			{estimator.Config{Alpha: 2}, "Alpha"},
			{estimator.Config{Alpha: -1}, "Alpha"},
			{estimator.Config{MaxEntries: -1}, "MaxEntries"},
		} {
			_, err := estimator.New(&tc.cfg)
			require.ErrorContains(t, err, tc.field)
		}
	})
}

// body is an Anthropic request with textBytes bytes of text (textBytes/4 tokens by the rule).
func body(textBytes int, model string) []byte {
	return []byte(fmt.Sprintf(`{"model":%q,"max_tokens":200,"messages":[{"role":"user","content":%q}]}`,
		model, strings.Repeat("y", textBytes)))
}

// One odd answer (an image-only message: few bytes, many tokens) moves a learned ratio by its
// weight, Alpha, not to MaxRatio: clamped only after the average, it made every later request
// reserve four times its input until some fifteen normal answers pulled it back.
func TestEstimator_OneOddAnswerWeighsAlpha(t *testing.T) {
	t.Parallel()
	e, err := estimator.New(nil)
	require.NoError(t, err)
	text := estimator.Estimate{Model: "claude", Raw: 1000}
	for range 50 {
		e.Observe("k", text, 1000)
	}
	require.InDelta(t, 1.0, e.Ratio("k", "claude"), 1e-9)
	e.Observe("k", estimator.Estimate{Model: "claude", Raw: 1}, 1500)
	// The odd ratio counts as MaxRatio (4): 1 + Alpha (0.2) × (4 − 1).
	require.InDelta(t, 1.6, e.Ratio("k", "claude"), 1e-9)
}

// TestEstimator_OutputAllowance: the output reserved is what the provider may produce: an OpenAI
// request's max_tokens times its n (each choice may use it all), and 4096.0 read as 4096, never
// an error that leaves the job reserving nothing.
func TestEstimator_OutputAllowance(t *testing.T) {
	t.Parallel()
	e, err := estimator.New(nil)
	require.NoError(t, err)
	for _, tc := range []struct {
		provider, body string
		want           int
	}{
		{tokens.ProviderOpenAI, `{"model":"g","max_tokens":100,"messages":[]}`, 100},
		{tokens.ProviderOpenAI, `{"model":"g","max_tokens":100,"n":1,"messages":[]}`, 100},
		{tokens.ProviderOpenAI, `{"model":"g","max_completion_tokens":100,"n":3,"messages":[]}`, 300},
		{tokens.ProviderAnthropic, `{"model":"c","max_tokens":4096.0,"messages":[]}`, 4096},
	} {
		est, err := e.Estimate("main", tc.provider, []byte(tc.body))
		require.NoError(t, err, tc.body)
		require.Equal(t, tc.want, est.MaxOutput, tc.body)
	}
}
