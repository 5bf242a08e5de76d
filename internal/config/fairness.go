package config

import (
	"math"
	"time"
)

// Fairness is how the workers share each credential between tenants and priorities (see the
// limiter's package doc and docs/decisions.md). Tenants share a credential by weight (ctl
// tenants set NAME --weight N); inside a tenant, its share goes to its highest priority with
// work, except for the minimum share each lower priority with work keeps, so that low never
// starves.
type Fairness struct {
	// MinShare is the least share of its tenant's slots that each priority keeps while it has work
	// and a higher priority of the same tenant has too.
	MinShare MinShare `yaml:"min_share"`
	// Horizon is how far ahead a credential's send slots are handed out: a job that arrives
	// waits at most about this long (plus its turn) behind slots already given to others.
	// Shorter: a new high-priority or other tenant's job goes sooner; waiting jobs ask again more
	// often. Default 50ms; between 10ms and 10s.
	Horizon time.Duration `yaml:"horizon"`
}

// MinShare is the minimum share of each lower priority, a fraction of its tenant's slots.
type MinShare struct {
	// Normal is the share normal work keeps beside high work. Default 0.1; between 0.01 and 0.5.
	Normal float64 `yaml:"normal"`
	// Low is the share low work keeps beside higher work. Default 0.05; between 0.01 and 0.5.
	Low float64 `yaml:"low"`
}

// Defaults of Fairness.
const (
	DefaultMinShareNormal  = 0.1
	DefaultMinShareLow     = 0.05
	DefaultFairnessHorizon = 50 * time.Millisecond
)

func (f *Fairness) withDefaults() {
	if f.MinShare.Normal == 0 {
		f.MinShare.Normal = DefaultMinShareNormal
	}
	if f.MinShare.Low == 0 {
		f.MinShare.Low = DefaultMinShareLow
	}
	if f.Horizon == 0 {
		f.Horizon = DefaultFairnessHorizon
	}
}

func (f *Fairness) validate(bad func(field, format string, args ...any)) {
	for _, s := range []struct {
		field string
		v     float64
	}{{"fairness.min_share.normal", f.MinShare.Normal}, {"fairness.min_share.low", f.MinShare.Low}} {
		if math.IsNaN(s.v) || s.v < 0.01 || s.v > 0.5 {
			bad(s.field, "must be between 0.01 and 0.5 (a fraction of the tenant's slots), got %v", s.v)
		}
	}
	if sum := f.MinShare.Normal + f.MinShare.Low; sum > 0.9 { // limiter.Fairness refuses more
		bad("fairness.min_share", "normal + low must be at most 0.9 (the rest is the high jobs'), got %v", sum)
	}
	if f.Horizon < 10*time.Millisecond || f.Horizon > 10*time.Second {
		bad("fairness.horizon", "must be between 10ms and 10s (got %s)", f.Horizon)
	}
}
