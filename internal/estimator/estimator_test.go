package estimator_test

import (
	"fmt"
	"runtime"
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
		est, err := e.Estimate("main", "", tokens.ProviderAnthropic, body(8000, "claude"))
		require.NoError(t, err)
		require.Equal(t, estimator.Estimate{Model: "claude", Raw: 2000, MinRaw: 2000, Ratio: 1.25, Input: 2500, MaxOutput: 200}, est)
		// The provider counted exactly the rule (as cmd/llmsim does): after a few answers,
		// exact. The first weighs its size (2,000) against PriorWeight (1,000).
		e.Observe("main", est, 2000)
		require.InDelta(t, 1.25+2000.0/2800*(1-1.25), e.Ratio("main", "", "claude"), 1e-9)
		for range 29 {
			e.Observe("main", est, 2000)
		}
		est, err = e.Estimate("main", "", tokens.ProviderAnthropic, body(8000, "claude"))
		require.NoError(t, err)
		require.InDelta(t, 1.0, est.Ratio, 1e-3)
		require.InDelta(t, 2000, est.Input, 1)
		// Other credentials and models start conservative.
		require.Equal(t, 1.25, e.Ratio("other", "", "claude"))
		require.Equal(t, 1.25, e.Ratio("main", "", "haiku"))

		mfs, err := reg.Gather()
		require.NoError(t, err)
		require.Len(t, mfs, 1)
		require.Equal(t, "llmq_tokens_estimate_ratio", mfs[0].GetName())
		h := mfs[0].GetMetric()[0].GetHistogram()
		require.Equal(t, uint64(30), h.GetSampleCount())
		require.InDelta(t, 30*1.25, h.GetSampleSum(), 1e-9)
	})

	t.Run("MovingAverageConverges", func(t *testing.T) {
		t.Parallel()
		e, err := estimator.New(nil)
		require.NoError(t, err)
		est := estimator.Estimate{Model: "gpt", Raw: 1000}
		for range 30 {
			e.Observe("k", est, 1000) // ratio 1
		}
		require.InDelta(t, 1.0, e.Ratio("k", "", "gpt"), 1e-3)
		// The provider now counts 50% more (say, tool definitions the rule ignores): a report
		// the size of the recent ones weighs Alpha.
		e.Observe("k", est, 1500)
		require.InDelta(t, 1.1, e.Ratio("k", "", "gpt"), 1e-3)
		for range 30 {
			e.Observe("k", est, 1500)
		}
		require.InDelta(t, 1.5, e.Ratio("k", "", "gpt"), 0.001)
		got, err := e.Estimate("k", "", tokens.ProviderOpenAI, body(4000, "gpt"))
		require.NoError(t, err)
		require.InDelta(t, 1500, got.Input, 2)
		// No usage, nothing learned.
		e.Observe("k", est, 0)
		require.InDelta(t, 1.5, e.Ratio("k", "", "gpt"), 0.001)
	})

	t.Run("Clamped", func(t *testing.T) {
		t.Parallel()
		e, err := estimator.New(&estimator.Config{MinRatio: 0.5, MaxRatio: 2})
		require.NoError(t, err)
		e.Observe("k", estimator.Estimate{Model: "a", Raw: 1e6}, 1e8)
		require.InDelta(t, 2.0, e.Ratio("k", "", "a"), 1e-3)
		e.Observe("k", estimator.Estimate{Model: "b", Raw: 1e6}, 1)
		require.InDelta(t, 0.5, e.Ratio("k", "", "b"), 1e-3)
	})

	t.Run("MaxEntries", func(t *testing.T) {
		t.Parallel()
		e, err := estimator.New(&estimator.Config{MaxEntries: 2})
		require.NoError(t, err)
		// Below InitialRatio: a forgotten entry is back at InitialRatio whatever the
		// credential's ratio for the model (see TestEstimator_NewTenantStartsNoLowerThanTheCredential).
		for _, m := range []string{"a", "b", "c"} {
			e.Observe("k", estimator.Estimate{Model: m, Raw: 1e6}, 5e5)
		}
		learned := 0
		for _, m := range []string{"a", "b", "c"} {
			if e.Ratio("k", "", m) < 0.6 {
				learned++
			}
		}
		require.Equal(t, 2, learned)
		require.InDelta(t, 0.5, e.Ratio("k", "", "c"), 1e-3)
	})

	t.Run("Concurrent", func(t *testing.T) {
		t.Parallel()
		e, err := estimator.New(nil)
		require.NoError(t, err)
		var wg sync.WaitGroup
		for g := range 8 {
			wg.Go(func() {
				for range 200 {
					est, err := e.Estimate(fmt.Sprint("c", g%2), "", tokens.ProviderOpenAI, body(400, "m"))
					if err != nil {
						t.Error(err)
						return
					}
					e.Observe(fmt.Sprint("c", g%2), est, 120)
				}
			})
		}
		wg.Wait()
		require.InDelta(t, 1.2, e.Ratio("c0", "", "m"), 1e-9)
		require.InDelta(t, 1.2, e.Ratio("c1", "", "m"), 1e-9)
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
// size, not to MaxRatio: clamped only after the average, it made every later request reserve
// four times its input until some fifteen normal answers pulled it back; clamped first, it still
// weighed Alpha (the ratio went from 1 to 1.6).
func TestEstimator_OneOddAnswerWeighsItsSize(t *testing.T) {
	t.Parallel()
	e, err := estimator.New(nil)
	require.NoError(t, err)
	text := estimator.Estimate{Model: "claude", Raw: 1000}
	for range 50 {
		e.Observe("k", text, 1000)
	}
	require.InDelta(t, 1.0, e.Ratio("k", "", "claude"), 1e-5)
	e.Observe("k", estimator.Estimate{Model: "claude", Raw: 1}, 1500)
	// The odd ratio counts as MaxRatio (4), its 1 token against the recent ones' weight
	// (1,000 / Alpha, decayed by 1 − Alpha): 1 + 1 / (4,000 + 1) × (4 − 1).
	require.InDelta(t, 1+3.0/4001, e.Ratio("k", "", "claude"), 1e-5)
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
		est, err := e.Estimate("main", "", tc.provider, []byte(tc.body))
		require.NoError(t, err, tc.body)
		require.Equal(t, tc.want, est.MaxOutput, tc.body)
	}
}

// One tenant's prompts do not move another's estimate on the same credential and model: a tenant
// sending whitespace runs the provider counts at a quarter of the rule taught every tenant to
// reserve a quarter of its input (429s for all), and one sending images (many tokens, few bytes)
// taught every tenant to reserve four times its input (a quarter of the limit used; under fair
// queueing, a smaller share for the tenants that sent none).
func TestEstimator_PerTenant(t *testing.T) {
	t.Parallel()
	e, err := estimator.New(nil)
	require.NoError(t, err)
	a, err := e.Estimate("main", "a", tokens.ProviderAnthropic, body(8000, "claude"))
	require.NoError(t, err)
	for range 30 {
		e.Observe("main", a, a.Raw/4)
	}
	b, err := e.Estimate("main", "b", tokens.ProviderAnthropic, body(8000, "claude"))
	require.NoError(t, err)
	require.Equal(t, 1.25, b.Ratio, "tenant b reserves what tenant a's prompts taught")
	require.InDelta(t, 0.25, e.Ratio("main", "a", "claude"), 1e-3)
	// b's answers teach b alone.
	for range 30 {
		e.Observe("main", b, b.Raw*2)
	}
	require.InDelta(t, 2.0, e.Ratio("main", "b", "claude"), 1e-3)
	require.InDelta(t, 0.25, e.Ratio("main", "a", "claude"), 1e-3)
}

// A tenant not yet reported on starts from the ratio the credential learned for the model when
// that is above InitialRatio: on a credential whose prompts all count at twice the rule (code,
// tool definitions), each new tenant, each tenant after a worker's restart and each entry
// forgotten beyond MaxEntries reserved 1.25 × the rule, and its first requests overdrew the
// input-token limit (429s for every tenant on the credential). A credential learned below
// InitialRatio does not lower a new tenant's start (TestEstimator_PerTenant).
func TestEstimator_NewTenantStartsNoLowerThanTheCredential(t *testing.T) {
	t.Parallel()
	e, err := estimator.New(&estimator.Config{MaxEntries: 1})
	require.NoError(t, err)
	a, err := e.Estimate("main", "a", tokens.ProviderAnthropic, body(8000, "claude"))
	require.NoError(t, err)
	for range 30 {
		e.Observe("main", a, a.Raw*2)
	}
	b, err := e.Estimate("main", "b", tokens.ProviderAnthropic, body(8000, "claude"))
	require.NoError(t, err)
	require.InDelta(t, 2.0, b.Ratio, 1e-3, "a new tenant under-reserved on a credential counted at 2")
	require.Equal(t, 1.25, e.Ratio("other", "b", "claude"), "other credentials start at InitialRatio")
	require.Equal(t, 1.25, e.Ratio("main", "b", "haiku"), "other models start at InitialRatio")
	// Its own first answer starts from it, as from InitialRatio: 2 + 2,000 / (1,000 × (1 −
	// Alpha) + 2,000) × (1 − 2). a is forgotten (MaxEntries 1) and starts from the
	// credential's ratio again (2 + Alpha × (1 − 2): a report the size of the recent ones),
	// not from 1.25.
	e.Observe("main", b, b.Raw)
	require.InDelta(t, 2-2000.0/2800, e.Ratio("main", "b", "claude"), 1e-3)
	require.InDelta(t, 1.8, e.Ratio("main", "a", "claude"), 1e-3, "a forgotten tenant under-reserved")
}

// A tenant that makes up model names (a gateway takes any) fills the table with its own entries
// and forgets them, least recently used first; other tenants keep what they learned, and so does
// the credential's ratio for their model. Beyond MaxEntries an arbitrary entry was forgotten: the
// other tenants' ratios went back to InitialRatio (a credential counted at twice the rule
// under-reserved, 429s for all) and the tenant's own model in use was forgotten with the rest.
func TestEstimator_MadeUpModelsForgetTheirTenantsOwn(t *testing.T) {
	t.Parallel()
	e, err := estimator.New(&estimator.Config{MaxEntries: 10})
	require.NoError(t, err)
	for _, tenant := range []string{"a", "b"} {
		e.Observe("main", estimator.Estimate{Tenant: tenant, Model: "claude", Raw: 1e6}, 2e6)
	}
	e.Observe("main", estimator.Estimate{Tenant: "m", Model: "real", Raw: 1e6}, 3e6)
	for i := range 1000 {
		e.Observe("main", estimator.Estimate{Tenant: "m", Model: fmt.Sprint("made-up-", i), Raw: 1e6}, 5e5)
		require.InDelta(t, 3.0, e.Ratio("main", "m", "real"), 0.01, "m's model in use forgotten after %d made-up ones", i+1)
	}
	require.InDelta(t, 2.0, e.Ratio("main", "a", "claude"), 0.01, "tenant a's ratio forgotten")
	require.InDelta(t, 2.0, e.Ratio("main", "b", "claude"), 0.01, "tenant b's ratio forgotten")
	require.InDelta(t, 2.0, e.Ratio("main", "c", "claude"), 0.01, "the credential's ratio for claude forgotten")
	require.InDelta(t, 0.5, e.Ratio("main", "m", "made-up-999"), 0.01)
	require.InDelta(t, 1.25, e.Ratio("main", "m", "made-up-0"), 0.01, "m's least recent entry kept")

	// A tenant holding less than its share takes its place from the tenant holding the most.
	e.Observe("main", estimator.Estimate{Tenant: "d", Model: "claude", Raw: 1e6}, 1.5e6)
	require.InDelta(t, 1.5, e.Ratio("main", "d", "claude"), 0.01)
	require.InDelta(t, 2.0, e.Ratio("main", "a", "claude"), 0.01)
	require.InDelta(t, 2.0, e.Ratio("main", "b", "claude"), 0.01)
	require.InDelta(t, 3.0, e.Ratio("main", "m", "real"), 0.01)
}

// One small answer does not set what a tenant's big prompts reserve: each answer weighs its
// prompt's size. A tenant's first answer set its ratio outright, so an image of few bytes and
// many tokens (a ratio of 4) made its next big prompts reserve four times their input (they
// waited for budget they did not use), and a short prompt of whitespace runs (a quarter) made
// them reserve a quarter of it (429s from the provider); later answers pulled it back by Alpha
// each, over a dozen answers.
func TestEstimator_OneSmallAnswerDoesNotSetTheRatio(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name          string
		small         estimator.Estimate
		smallReported int
		bigRatio      float64
	}{
		// an image-only message: 10 tokens by the rule, 1,600 counted (clamped to 4)
		{"ImageThenText", estimator.Estimate{Tenant: "a", Model: "claude", Raw: 10}, 1600, 1},
		// whitespace runs: 20 tokens by the rule, 5 counted; the big prompts count twice the rule
		{"WhitespaceThenCode", estimator.Estimate{Tenant: "a", Model: "claude", Raw: 20}, 5, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e, err := estimator.New(nil)
			require.NoError(t, err)
			big := func() estimator.Estimate {
				est, err := e.Estimate("main", "a", tokens.ProviderAnthropic, body(32000, "claude"))
				require.NoError(t, err)
				require.Equal(t, 8000, est.Raw)
				return est
			}
			e.Observe("main", tc.small, tc.smallReported)
			// The small answer alone: the next big prompt reserves about what it did before it.
			require.InDelta(t, 1.25*8000, big().Input, 0.05*8000, "one small answer set the ratio")
			// Two big answers: the next big prompt reserves about what they were counted.
			want := tc.bigRatio * 8000
			for range 2 {
				e.Observe("main", big(), int(want))
			}
			require.InDelta(t, want, big().Input, 0.05*want, "the small answer still weighs as much as the big ones")
		})
	}
}

// BenchmarkEstimator_ObserveFull measures an answer that inserts into a full table, with 10,000
// tenants: each op, a tenant holding less than its share learns a new model (it takes the place
// of the least recent entry of the tenant holding the most), and that tenant, making up model
// names, learns one more (it forgets its own). A tenant below its share found the one to take a
// place from by a scan of the tenants (half of them, on average, here).
func BenchmarkEstimator_ObserveFull(b *testing.B) {
	const tenants, cycle = 10000, 2000
	names := make([]string, tenants)
	models := make([]string, tenants)
	for i := range tenants {
		names[i], models[i] = fmt.Sprint("tenant-", i), fmt.Sprint("made-up-", i)
	}
	fill := func() *estimator.Estimator {
		e, err := estimator.New(&estimator.Config{MaxEntries: 2 * tenants})
		require.NoError(b, err)
		for i := range tenants {
			e.Observe("main", estimator.Estimate{Tenant: "m", Model: models[i], Raw: 1000}, 500)
			e.Observe("main", estimator.Estimate{Tenant: names[i], Model: "claude", Raw: 1000}, 1000)
		}
		runtime.GC() // the filling's garbage is not the ops'
		return e
	}
	e := fill()
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		if i%cycle == 0 && i > 0 {
			b.StopTimer()
			e = fill()
			b.StartTimer()
		}
		n := i % cycle
		e.Observe("main", estimator.Estimate{Tenant: names[n], Model: models[n], Raw: 1000}, 1000)
		e.Observe("main", estimator.Estimate{Tenant: "m", Model: names[n], Raw: 1000}, 500)
	}
}

// TestEstimator_ObserveKeepsItsSeries: an answer's ratio is observed in its credential's series,
// looked up once rather than per answer (issue 23), each credential in its own, and learning
// from an answer of a known credential, tenant and model allocates nothing.
func TestEstimator_ObserveKeepsItsSeries(t *testing.T) { // not parallel: AllocsPerRun counts every goroutine's allocations
	reg := prometheus.NewRegistry()
	e, err := estimator.New(&estimator.Config{Metrics: estimator.NewMetrics(reg)})
	require.NoError(t, err)
	est := estimator.Estimate{Model: "claude", Raw: 100, Input: 125}
	e.Observe("main", est, 100)
	allocs := testing.AllocsPerRun(50, func() { e.Observe("main", est, 100) })
	require.Zero(t, allocs)
	e.Observe("other", est, 250)
	mfs, err := reg.Gather()
	require.NoError(t, err)
	require.Len(t, mfs, 1)
	counts := map[string]uint64{}
	for _, m := range mfs[0].GetMetric() {
		counts[m.GetLabel()[0].GetValue()] = m.GetHistogram().GetSampleCount()
	}
	require.Equal(t, map[string]uint64{"main": 52, "other": 1}, counts)
}

// TestEstimator_EstimateAllocs pins the allocations of a small chat request's estimate, which the
// worker makes at every admission: tokens.Count's (the model's string and the messages' list)
// and nothing of its own, the ratio looked up for a known credential, tenant and model. The
// fields Count reads into were moved to the heap for its json.Unmarshal fallback: 3.
func TestEstimator_EstimateAllocs(t *testing.T) { // not parallel: AllocsPerRun counts every goroutine's allocations
	if raceEnabled {
		t.Skip("allocations are counted without the race detector")
	}
	e, err := estimator.New(nil)
	require.NoError(t, err)
	body := []byte(`{"model":"claude","max_tokens":16,"messages":[{"role":"user","content":"bench request 7"}]}`)
	est, err := e.Estimate("main", "acme", tokens.ProviderAnthropic, body)
	require.NoError(t, err)
	e.Observe("main", est, 100)
	allocs := testing.AllocsPerRun(100, func() {
		if _, err := e.Estimate("main", "acme", tokens.ProviderAnthropic, body); err != nil {
			panic(err)
		}
	})
	t.Logf("Estimate: %.1f allocations", allocs)
	require.LessOrEqual(t, allocs, 2.0, "allocations per estimate")
}
