// Package credstate reads a credential's shared state as every worker sees it (the limit in
// force and where it came from, its token limits, a pause, a Retry-After push-back, the
// breaker), for the operators' views: `ctl credentials list` and the console's credentials page.
package credstate

import (
	"context"
	"time"

	"github.com/llmq/llmq/internal/breaker"
	"github.com/llmq/llmq/internal/credpause"
	"github.com/llmq/llmq/internal/limiter"
)

// State is a credential's shared state. The JSON names are those of `ctl credentials list
// --json` and of the console's API.
type State struct {
	LimitSource string     `json:"limit_source,omitempty"`
	RatePerSec  float64    `json:"requests_per_second"`
	Burst       int        `json:"burst"`
	Paused      bool       `json:"paused"`
	PausedSince *time.Time `json:"paused_since,omitempty"`
	PauseReason string     `json:"pause_reason,omitempty"`
	FirstJobID  string     `json:"pause_first_job_id,omitempty"`
	PushedBack  *time.Time `json:"pushed_back_until,omitempty"`
	PushReason  string     `json:"push_back_reason,omitempty"`
	Breaker     string     `json:"breaker,omitempty"`
	BreakerTill *time.Time `json:"breaker_until,omitempty"`
	// TokenLimits are the token buckets in force (limiter.Gate.CurrentTokenBuckets), input,
	// output, then combined, each only when it has a limit: empty, not nil, when none has.
	TokenLimits []TokenLimit `json:"token_limits"`
}

// TokenLimit is one token bucket in force.
type TokenLimit struct {
	// Bucket is "input", "output" (Anthropic's) or "combined" (OpenAI's tokens per minute).
	Bucket string `json:"bucket"`
	// PerMinute is its limit, in tokens per minute.
	PerMinute float64 `json:"per_minute"`
	// Source is where the limit came from (limiter.LimitSource: configured, learned).
	Source string `json:"source"`
}

// Read reads the state of the credential behind gate and circuit. configured is the credential's
// configured limit (zero: none): before any worker reserved, it is what the next reservation
// will apply, and it is reported as the configured limit. pauses is where pauses are kept
// (nil: Redis only): a pause state Redis lost (limiter.PauseState.Unknown) is read from there
// and restored into Redis (credpause.Store.Restore), so that a paused credential shows as paused
// right after Redis lost its data, not only once a worker's refresh restored it. Errors are the
// stores' (Redis's, or Postgres's matching credpause.ErrDatabase).
func Read(ctx context.Context, gate *limiter.Gate, circuit *breaker.Circuit, configured limiter.Limit,
	pauses *credpause.Store) (State, error) {
	var st State
	l, src, err := gate.Current(ctx)
	if err != nil {
		return st, err
	}
	if (configured.Rate > 0 || configured.Burst > 0) && src == limiter.SourceUnknown {
		l, src = configured, limiter.SourceConfigured
	}
	st.LimitSource, st.RatePerSec, st.Burst = string(src), l.Rate, l.Burst
	ps, err := gate.Paused(ctx)
	if err == nil && ps.Unknown && pauses != nil {
		ps, _, err = pauses.Restore(ctx, gate)
	}
	if err != nil {
		return st, err
	}
	if ps.Paused {
		since := ps.Since
		st.Paused, st.PausedSince, st.PauseReason, st.FirstJobID = true, &since, ps.Reason, ps.FirstJobID
	}
	pb, err := gate.PushBack(ctx)
	if err != nil {
		return st, err
	}
	if pb.Active() {
		until := pb.Until.UTC()
		st.PushedBack, st.PushReason = &until, pb.Reason()
	}
	bs, err := circuit.Status(ctx)
	if err != nil {
		return st, err
	}
	st.Breaker = string(bs.State)
	if bs.State != breaker.Closed && !bs.Until.IsZero() {
		until := bs.Until
		st.BreakerTill = &until
	}
	tb, err := gate.CurrentTokenBuckets(ctx)
	if err != nil {
		return st, err
	}
	st.TokenLimits = []TokenLimit{}
	for _, b := range []struct {
		name string
		b    limiter.TokenBucket
	}{{"input", tb.Input}, {"output", tb.Output}, {"combined", tb.Combined}} {
		if b.b.PerMinute > 0 {
			st.TokenLimits = append(st.TokenLimits, TokenLimit{Bucket: b.name, PerMinute: b.b.PerMinute,
				Source: string(b.b.Source)})
		}
	}
	return st, nil
}
