package breaker

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// Config configures a Breaker. Zero fields take the defaults documented on each field; nil is
// accepted as all defaults.
type Config struct {
	// Prefix starts every key. Default "llmq:". Tests pass redistest.Prefix(t).
	Prefix string
	// Now is the clock. Nil (production): the scripts read Redis TIME, so every process shares
	// Redis's clock and local clock skew cannot make two processes disagree about a cooldown.
	// Tests inject a clock; every process must then use the same one.
	Now func() time.Time
	// Threshold is how many consecutive server-side failures open a closed breaker. Default 5.
	Threshold int
	// Cooldown is how long an open breaker refuses everything before it admits a probe.
	// Default 30s.
	Cooldown time.Duration
	// ProbeTimeout is how long a probe may stay unreported (its process crashed, or the caller
	// never sent it) before another caller becomes the probe. Default 2m: LLM calls are slow.
	ProbeTimeout time.Duration
	// Recheck is how long a caller refused while a probe is out is told to wait (RetryAt)
	// before asking again, capped at the probe's deadline. Default 1s.
	Recheck time.Duration
	// IdleTTL is how long a closed breaker's key (its failure count, its generation) lives
	// after its last write. Failures older than that with nothing reported since are
	// forgotten. Default 10m.
	IdleTTL time.Duration
	// Metrics receives the breaker's metrics; nil records none.
	Metrics *Metrics
}

// Defaults of Config.
const (
	DefaultThreshold    = 5
	DefaultCooldown     = 30 * time.Second
	DefaultProbeTimeout = 2 * time.Minute
	DefaultRecheck      = time.Second
	DefaultIdleTTL      = 10 * time.Minute
)

// abandonedTTL is how long an open or half-open key outlives its cooldown or probe deadline
// when no process touches it any more (a credential removed from the config). It is long on
// purpose: a key that expires reads as closed, and a burst after a quiet hour should still meet
// the probe, not a provider that may still be down.
const abandonedTTL = 24 * time.Hour

func (c Config) withDefaults() Config {
	if c.Prefix == "" {
		c.Prefix = DefaultPrefix
	}
	if c.Threshold == 0 {
		c.Threshold = DefaultThreshold
	}
	if c.Cooldown == 0 {
		c.Cooldown = DefaultCooldown
	}
	if c.ProbeTimeout == 0 {
		c.ProbeTimeout = DefaultProbeTimeout
	}
	if c.Recheck == 0 {
		c.Recheck = DefaultRecheck
	}
	if c.IdleTTL == 0 {
		c.IdleTTL = DefaultIdleTTL
	}
	return c
}

func (c Config) validate() error {
	switch {
	case c.Threshold < 1:
		return fmt.Errorf("Threshold %d: want at least 1", c.Threshold)
	case c.Cooldown < time.Millisecond:
		return fmt.Errorf("Cooldown %v: want at least 1ms", c.Cooldown)
	case c.ProbeTimeout < time.Millisecond:
		return fmt.Errorf("ProbeTimeout %v: want at least 1ms", c.ProbeTimeout)
	case c.Recheck < time.Millisecond:
		return fmt.Errorf("Recheck %v: want at least 1ms", c.Recheck)
	case c.IdleTTL < time.Second:
		return fmt.Errorf("IdleTTL %v: want at least 1s", c.IdleTTL)
	}
	return nil
}

// State is a breaker's state.
type State string

// The states of a breaker.
const (
	// Closed admits every request and counts consecutive server-side failures.
	Closed State = "closed"
	// Open refuses every request until its cooldown ends.
	Open State = "open"
	// HalfOpen admits exactly one request (the probe) across all processes at a time; the
	// probe's outcome closes or re-opens the breaker.
	HalfOpen State = "half_open"
)

var states = []State{Closed, Open, HalfOpen}

// Outcome is what an admitted request's response says about the provider's health.
type Outcome int

// The outcomes a caller reports.
const (
	// Success is a response that shows the provider serving: a 2xx. It resets the closed
	// breaker's failure count, and a probe's success closes the breaker.
	Success Outcome = iota + 1
	// Failure is a server-side failure: 5xx, 529, a timeout, a connection error. It counts
	// toward Threshold; a probe's failure re-opens the breaker for a fresh cooldown.
	Failure
	// Neutral says nothing about the provider's health: a 4xx, a 429 with Retry-After (the
	// limiter's business), a request canceled or never sent. It neither counts nor resets the
	// failure count, so failures interleaved with 429s still open the breaker. A probe
	// reporting Neutral hands the probe on: the next caller becomes the probe at once.
	Neutral
)

// String returns "success", "failure" or "neutral".
func (o Outcome) String() string {
	switch o {
	case Success:
		return "success"
	case Failure:
		return "failure"
	case Neutral:
		return "neutral"
	}
	return "Outcome(" + strconv.Itoa(int(o)) + ")"
}

// Breaker is the circuit breaker of every provider key, shared by all processes through Redis.
// It is safe for concurrent use; two Breakers on the same Redis and prefix (in one process or
// many) share all state.
type Breaker struct {
	rdb redis.UniversalClient
	cfg Config
}

// New returns a Breaker over rdb. cfg may be nil. It returns an error naming the field when cfg
// is invalid; it does not contact Redis.
func New(rdb redis.UniversalClient, cfg *Config) (*Breaker, error) {
	if rdb == nil {
		return nil, errors.New("new breaker: nil redis client")
	}
	var c Config
	if cfg != nil {
		c = *cfg
	}
	c = c.withDefaults()
	if err := c.validate(); err != nil {
		return nil, fmt.Errorf("new breaker: %w", err)
	}
	return &Breaker{rdb: rdb, cfg: c}, nil
}

// Credential is the breaker of one provider key. Make it with Breaker.Credential; it is cheap,
// holds no state of its own and is safe for concurrent use.
type Credential struct {
	b    *Breaker
	name string
	key  string
}

// Credential returns the breaker of the provider key id. id is only hashed (the key looks like
// "<prefix>{<sha256 hex of id>}:cb", beside the limiter's keys): it never reaches Redis, logs or
// metrics. Pass the API key itself, so that two credential names sharing one key share its
// breaker. name is the credential's name, used only as the metrics label.
func (b *Breaker) Credential(id, name string) *Credential {
	return &Credential{b: b, name: name, key: breakerKey(b.cfg.Prefix, credentialTag(id))}
}

// Admission is Allow's answer.
type Admission struct {
	// Allowed reports whether the request may be sent now. When it is, the caller must Report
	// its outcome with this Admission (Neutral if it ends up not sending it).
	Allowed bool
	// Probe reports whether this request is the half-open breaker's single probe.
	Probe bool
	// State is the breaker's state as this call left it.
	State State
	// RetryAt is when a refused caller should ask again: the end of the cooldown while open, a
	// short re-check (Config.Recheck, capped at the probe's deadline) while a probe is out.
	// Zero when Allowed; UTC otherwise. The caller defers the job without counting an attempt.
	RetryAt time.Time
	// Wait is RetryAt less now, on the breaker's clock (Redis TIME unless Config.Now is set):
	// hand this to a scheduler rather than comparing RetryAt with a local clock.
	Wait time.Duration

	// gen is the breaker's generation this admission belongs to; Report ignores reports from
	// ended generations.
	gen int64
}

// Allow asks whether a request may be sent: a closed breaker admits everyone; an open one
// refuses until its cooldown ends, then makes exactly one caller, across all processes, the
// probe (the breaker turns half-open) and refuses the others until the probe reports or
// ProbeTimeout passes. A refusal is not an error: Allowed is false and RetryAt says when to ask
// again. Allow returns an error only when Redis fails (the Admission is then zero).
func (c *Credential) Allow(ctx context.Context) (Admission, error) {
	cfg := &c.b.cfg
	res, err := allowScript.Run(ctx, c.b.rdb, []string{c.key},
		c.b.nowArg(), cfg.ProbeTimeout.Microseconds(), cfg.Recheck.Microseconds(),
		(cfg.ProbeTimeout + abandonedTTL).Milliseconds()).Slice()
	if err != nil {
		return Admission{}, fmt.Errorf("breaker allow: %w", err)
	}
	if len(res) != 7 {
		return Admission{}, fmt.Errorf("breaker allow: unexpected reply %v", res)
	}
	a := Admission{
		Allowed: toInt(res[0]) == 1,
		Probe:   toInt(res[1]) == 1,
		State:   State(toString(res[2])),
		gen:     toInt(res[5]),
	}
	if at := toInt(res[3]); at > 0 {
		a.RetryAt = time.UnixMicro(at).UTC()
		a.Wait = max(time.Duration(at-toInt(res[4]))*time.Microsecond, 0)
	}
	m := cfg.Metrics
	m.setState(c.name, a.State)
	if toInt(res[6]) == 1 {
		m.transitioned(c.name, HalfOpen)
	}
	if !a.Allowed {
		m.rejected(c.name)
	}
	return a, nil
}

// Report records the outcome of a request Allow admitted, and returns the breaker's state after
// it. In a closed breaker, Threshold consecutive Failures open it and a Success resets the
// count. A probe's Success closes the breaker and clears the count; its Failure re-opens it for
// a fresh Cooldown; its Neutral hands the probe to the next caller. Reports from admissions
// whose state has since ended are ignored: a request in flight when the breaker opened does
// not extend or re-open it, and a probe replaced after ProbeTimeout no longer decides. Reporting
// a refused Admission, or an Outcome that is not one of the three, is a programming error and
// returns an error without touching Redis. Otherwise Report returns an error only when Redis
// fails.
func (c *Credential) Report(ctx context.Context, a Admission, o Outcome) (State, error) {
	if !a.Allowed {
		return "", errors.New("breaker report: the admission was refused")
	}
	if o < Success || o > Neutral {
		return "", fmt.Errorf("breaker report: invalid outcome %d", int(o))
	}
	cfg := &c.b.cfg
	res, err := reportScript.Run(ctx, c.b.rdb, []string{c.key},
		c.b.nowArg(), a.gen, o.String(), cfg.Threshold, cfg.Cooldown.Microseconds(),
		cfg.IdleTTL.Milliseconds(), (cfg.Cooldown + abandonedTTL).Milliseconds()).Slice()
	if err != nil {
		return "", fmt.Errorf("breaker report: %w", err)
	}
	if len(res) != 2 {
		return "", fmt.Errorf("breaker report: unexpected reply %v", res)
	}
	st := State(toString(res[0]))
	cfg.Metrics.setState(c.name, st)
	if to := toString(res[1]); to != "" {
		cfg.Metrics.transitioned(c.name, State(to))
	}
	return st, nil
}

// Status is a breaker's state as stored, for operators (ctl credentials list) and metrics.
// Its times are UTC.
type Status struct {
	// State is the stored state. An open breaker whose cooldown has ended stays Open until
	// the next Allow turns it half-open.
	State State
	// Since is when the state began; zero for a closed breaker that never opened (or whose
	// key expired).
	Since time.Time
	// Until is the end of the cooldown while Open, the probe's deadline while HalfOpen with a
	// probe out; zero otherwise.
	Until time.Time
	// Failures is the count of consecutive failures while Closed.
	Failures int
}

// Status reads the credential's breaker. It makes no transition and returns an error only when
// Redis fails.
func (c *Credential) Status(ctx context.Context) (Status, error) {
	v, err := c.b.rdb.HMGet(ctx, c.key, "state", "since", "until", "fails").Result()
	if err != nil {
		return Status{}, fmt.Errorf("breaker status: %w", err)
	}
	s := Status{State: Closed}
	if st, ok := v[0].(string); ok {
		s.State = State(st)
	}
	if us := toInt(v[1]); us > 0 {
		s.Since = time.UnixMicro(us).UTC()
	}
	if us := toInt(v[2]); us > 0 && s.State != Closed {
		s.Until = time.UnixMicro(us).UTC()
	}
	if s.State == Closed {
		s.Failures = int(toInt(v[3]))
	}
	c.b.cfg.Metrics.setState(c.name, s.State)
	return s, nil
}

// nowArg is the scripts' "now" argument: the injected clock in µs, or "" for Redis TIME.
func (b *Breaker) nowArg() string {
	if b.cfg.Now == nil {
		return ""
	}
	return strconv.FormatInt(b.cfg.Now().UnixMicro(), 10)
}

func toInt(v any) int64 {
	switch x := v.(type) {
	case int64:
		return x
	case string:
		n, _ := strconv.ParseInt(x, 10, 64)
		return n
	}
	return 0
}

func toString(v any) string {
	s, _ := v.(string)
	return s
}
