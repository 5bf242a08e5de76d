package estimator

import (
	"fmt"
	"math"
	"sync"

	"github.com/llmq/llmq/internal/tokens"
)

// Config configures an Estimator. Zero fields take the defaults documented on each; nil is all
// defaults.
type Config struct {
	// InitialRatio scales the rule for a (credential, tenant, model) not yet reported on, or
	// the credential's ratio for the model (learned from every tenant's answers) when that is
	// higher. Default 1.25: over-estimating costs a little pacing until the first answer is
	// reconciled; under-estimating costs 429s.
	InitialRatio float64
	// Alpha is the decay of the weight of earlier reports at each new one: a report of a prompt
	// the size of the recent ones weighs Alpha in the moving average, a smaller one less, a
	// bigger one more. Default 0.2.
	Alpha float64
	// PriorWeight is the weight, in prompt tokens by the rule, of the ratio an entry starts from
	// (InitialRatio, or the credential's ratio for the model) against its first reports: a
	// first report of a prompt far bigger than it all but sets the ratio, one far smaller (an
	// image of few bytes) barely moves it. It decays as a report's weight does. Default 1,000.
	PriorWeight float64
	// MinRatio and MaxRatio clamp the learned ratio. Defaults 0.25 and 4.
	MinRatio, MaxRatio float64
	// MaxEntries bounds the (credential, tenant, model) entries remembered, and apart the
	// (credential, model) ones. Beyond it, the least recently used entry of a tenant holding
	// its share (MaxEntries / tenants) or more is forgotten: the inserting tenant's own, else
	// the tenant holding the most. Default 10,000.
	MaxEntries int
	// Metrics receives the estimator's metrics; nil records none.
	Metrics *Metrics
}

func (c Config) withDefaults() Config {
	if c.InitialRatio == 0 {
		c.InitialRatio = 1.25
	}
	if c.Alpha == 0 {
		c.Alpha = 0.2
	}
	if c.PriorWeight == 0 {
		c.PriorWeight = 1000
	}
	if c.MinRatio == 0 {
		c.MinRatio = 0.25
	}
	if c.MaxRatio == 0 {
		c.MaxRatio = 4
	}
	if c.MaxEntries == 0 {
		c.MaxEntries = 10000
	}
	return c
}

func (c Config) validate() error {
	bad := func(f float64) bool { return math.IsNaN(f) || math.IsInf(f, 0) || f <= 0 }
	switch {
	case bad(c.MinRatio) || bad(c.MaxRatio) || c.MinRatio > c.MaxRatio:
		return fmt.Errorf("MinRatio %v, MaxRatio %v: want 0 < MinRatio <= MaxRatio", c.MinRatio, c.MaxRatio)
	case bad(c.InitialRatio) || c.InitialRatio < c.MinRatio || c.InitialRatio > c.MaxRatio:
		return fmt.Errorf("InitialRatio %v: want within MinRatio..MaxRatio", c.InitialRatio)
	case bad(c.Alpha) || c.Alpha > 1:
		return fmt.Errorf("Alpha %v: want in (0, 1]", c.Alpha)
	case bad(c.PriorWeight):
		return fmt.Errorf("PriorWeight %v: want above 0", c.PriorWeight)
	case c.MaxEntries < 1:
		return fmt.Errorf("MaxEntries %d: want at least 1", c.MaxEntries)
	}
	return nil
}

// Estimator scales the fixed rule by a ratio learned per (credential, tenant, model). It is safe
// for concurrent use; its state is this process's memory only.
type Estimator struct {
	cfg Config

	mu     sync.Mutex
	ratios *table
	// shared is the ratio per (credential, model) learned from every tenant's answers, key's
	// tenant empty, each entry belonging to the tenant whose answer made it: a tenant not yet
	// reported on starts no lower (see Ratio).
	shared *table
}

type key struct{ credential, tenant, model string }

// New returns an Estimator. cfg may be nil. It returns an error naming the field when cfg is
// invalid.
func New(cfg *Config) (*Estimator, error) {
	var c Config
	if cfg != nil {
		c = *cfg
	}
	c = c.withDefaults()
	if err := c.validate(); err != nil {
		return nil, fmt.Errorf("new token estimator: %w", err)
	}
	return &Estimator{cfg: c, ratios: newTable(c.MaxEntries), shared: newTable(c.MaxEntries)}, nil
}

// Estimate is what Estimator.Estimate returns for one request.
type Estimate struct {
	// Tenant is the tenant whose request it is: the ratio is learned per tenant.
	Tenant string
	// Model is the request's model.
	Model string
	// Raw is the fixed rule's input tokens (tokens.Request.Input): reserve at least this.
	Raw int
	// MinRaw is the least the input can be (tokens.Request.MinInput: Raw without what images of
	// unknown size were counted at the most): a request is too large only when it does not fit.
	MinRaw int
	// Ratio is the ratio Input was scaled by.
	Ratio float64
	// Input is the input tokens to reserve: Raw × Ratio, rounded up, at least 1.
	Input int
	// MaxOutput is the output allowance to reserve (tokens.Request.MaxOutput).
	MaxOutput int
	// AssumedOutput reports that the request sets no output allowance
	// (tokens.Request.AssumedOutput).
	AssumedOutput bool
}

// Estimate counts body, tenant's request (see tokens.Count), and scales its input tokens by the
// ratio learned for credential, tenant and the body's model. Errors are Count's.
func (e *Estimator) Estimate(credential, tenant, provider string, body []byte) (Estimate, error) {
	r, err := tokens.Count(provider, body)
	if err != nil {
		return Estimate{}, err
	}
	ratio := e.Ratio(credential, tenant, r.Model)
	return Estimate{Tenant: tenant, Model: r.Model, Raw: r.Input, MinRaw: r.MinInput, Ratio: ratio, Input: scale(r.Input, ratio),
		MaxOutput: r.MaxOutput, AssumedOutput: r.AssumedOutput}, nil
}

// scale is ceil(n × ratio), at least 1; the tiny tolerance keeps an exact ratio exact.
func scale(n int, ratio float64) int {
	return max(int(math.Ceil(float64(n)*ratio-1e-9)), 1)
}

// Ratio is the ratio in force for credential, tenant and model: the tenant's own once reported
// on; until then (a new tenant, a worker just started, an entry forgotten beyond MaxEntries)
// InitialRatio, or the ratio the credential learned for the model from every tenant's answers
// when that is higher. Not lower: one tenant's prompts the provider counts below the rule
// (whitespace runs) do not make another's first requests under-reserve; but a credential whose
// prompts all count above InitialRatio (code, tools, images) does not have each new tenant's
// first requests overdraw its token limit.
func (e *Estimator) Ratio(credential, tenant, model string) float64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.ratio(credential, tenant, model)
}

// ratio is Ratio with e.mu held.
func (e *Estimator) ratio(credential, tenant, model string) float64 {
	if s, ok := e.ratios.get(key{credential, tenant, model}); ok {
		return s.ratio
	}
	shared, _ := e.shared.get(key{credential: credential, model: model})
	return max(e.cfg.InitialRatio, shared.ratio)
}

// Observe learns from one answer: est is the Estimate the request was reserved with, reported
// the prompt tokens the provider reported (llm.Usage.PromptInput: the whole prompt, cached or
// not, as the rule counts it; not the uncached part alone, which would teach a credential whose
// prompts are cached to under-reserve every prompt that is not). A report of 0 or less (no
// usage) is ignored. The ratio reported / est.Raw is clamped to MinRatio..MaxRatio, then enters
// a moving average weighted by est.Raw: the ratio is the decayed sum of the reports' tokens over
// the decayed sum of their estimates (see learn), so one small answer (an image of few bytes
// and many tokens, say) cannot set what a tenant's big prompts reserve. It learns for est's
// tenant and model, starting from the ratio in force (see Ratio), and for the credential's ratio
// for the model that tenants not yet reported on start from, starting from InitialRatio.
// Clamped first, one odd answer weighs no more than MaxRatio times its estimate.
func (e *Estimator) Observe(credential string, est Estimate, reported int) {
	if reported <= 0 || est.Raw <= 0 {
		return
	}
	e.cfg.Metrics.observe(credential, est.Input, reported)
	obs := min(max(float64(reported)/float64(est.Raw), e.cfg.MinRatio), e.cfg.MaxRatio)
	size := float64(est.Raw)
	e.mu.Lock()
	defer e.mu.Unlock()
	start := e.ratio(credential, est.Tenant, est.Model)
	e.learn(e.ratios, key{credential, est.Tenant, est.Model}, est.Tenant, start, obs, size)
	e.learn(e.shared, key{credential: credential, model: est.Model}, est.Tenant, e.cfg.InitialRatio, obs, size)
}

// learn enters obs, the ratio of a report of a prompt of size tokens by the rule, into t's ratio
// for k, which starts at start with PriorWeight. The weight of what was learned decays by
// (1 - Alpha) and the report's size is added to it; the report moves the ratio by its share of
// that weight. So the ratio is the sum of the reports' tokens (clamped) over the sum of their
// estimates, each decayed by (1 - Alpha) per later report, the start counted as PriorWeight
// tokens: with reports of one size it is the moving average of weight Alpha it was. A new k
// belongs to tenant; beyond MaxEntries the table forgets the least recently used entry of a
// tenant holding its share or more (see table). e.mu is held.
func (e *Estimator) learn(t *table, k key, tenant string, start, obs, size float64) {
	s, ok := t.get(k)
	if !ok {
		s = state{ratio: start, weight: e.cfg.PriorWeight}
	}
	s.weight = (1-e.cfg.Alpha)*s.weight + size
	s.ratio += size / s.weight * (obs - s.ratio)
	s.ratio = min(max(s.ratio, e.cfg.MinRatio), e.cfg.MaxRatio)
	t.set(k, tenant, s)
}
