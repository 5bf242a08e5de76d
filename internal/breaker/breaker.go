package breaker

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/llmq/llmq/internal/redisscript"
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
	// Threshold is how many consecutive server-side failures open a closed breaker, and how
	// many requests a cold closed breaker lets out at once (see SuccessMemory). Default 5.
	Threshold int
	// Cooldown is how long an open breaker refuses everything before it admits a probe, the
	// first time it opens after being closed. Default 2s: a short outage is seen soon, and the
	// backoff (CooldownFactor, MaxCooldown) keeps a long one to a few probes a minute.
	Cooldown time.Duration
	// CooldownFactor multiplies the cooldown after each consecutive failed probe, up to
	// MaxCooldown; a successful probe (closing the breaker) resets it to Cooldown. Default 1.4;
	// 1 disables the backoff. Must be at least 1 and finite.
	CooldownFactor float64
	// MaxCooldown caps the cooldown CooldownFactor grows: it bounds how long a recovered
	// provider can go unnoticed (the worst-case delay from recovery to the probe that sees it,
	// plus that probe's round trip), and the probe rate of a long outage (one per MaxCooldown).
	// Default 30s, or Cooldown when that is longer. Must be at least Cooldown.
	MaxCooldown time.Duration
	// ProbeTimeout is how long a probe may stay unreported (its process crashed, or the caller
	// never sent it) before another caller becomes the probe. Default 2m: LLM calls are slow.
	ProbeTimeout time.Duration
	// Recheck is how long a caller refused while a probe is out, or by the cold-start cap, is
	// told to wait (RetryAt) before asking again, capped at the probe's (the first lease's)
	// deadline. Default 1s.
	Recheck time.Duration
	// SuccessMemory is how long a Success lifts the cold-start cap. A closed breaker that has
	// recorded no Success within SuccessMemory (a new or idle credential, or one whose answers
	// since have all been failures) admits only as many requests whose outcome is not yet
	// reported as Threshold less the failures it has counted; further callers are refused
	// (Admission.Capped) until one reports or Recheck passes. An unreported admission holds its
	// slot for at most ProbeTimeout. The first Success lifts the cap. To keep a healthy
	// credential's Reports read-only, a Success is recorded at most once per SuccessMemory/16,
	// so the cap may return up to that much before SuccessMemory has passed since the last one.
	// Default 1m; negative disables the cap (every closed Allow admits, as before).
	SuccessMemory time.Duration
	// IdleTTL is how long a closed breaker's key (its failure count, its generation, its last
	// Success) lives after its last write, and at least SuccessMemory and, while cold-start
	// slots are out, ProbeTimeout. Failures older than that with nothing reported since are
	// forgotten. Default 10m.
	IdleTTL time.Duration
	// Metrics receives the breaker's metrics; nil records none.
	Metrics *Metrics
}

// Defaults of Config.
const (
	DefaultThreshold    = 5
	DefaultCooldown     = 2 * time.Second
	DefaultMaxCooldown  = 30 * time.Second
	DefaultProbeTimeout = 2 * time.Minute
	DefaultRecheck      = time.Second
	DefaultIdleTTL      = 10 * time.Minute
	// DefaultCooldownFactor is CooldownFactor's default.
	DefaultCooldownFactor = 1.4
	DefaultSuccessMemory  = time.Minute
)

// successRefreshDiv sets how often a warm breaker records a Success: once per
// SuccessMemory/successRefreshDiv at most.
const successRefreshDiv = 16

// abandonedTTL is how long an open or half-open key outlives its cooldown or probe deadline
// when no process touches it any more (a credential removed from the config). It is long on
// purpose: a key that expires reads as closed, and a burst after a quiet hour should still meet
// the probe, not a provider that may still be down.
const abandonedTTL = 24 * time.Hour

func (c Config) withDefaults() Config {
	if c.Prefix == "" {
		c.Prefix = redisscript.DefaultPrefix
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
	if c.CooldownFactor == 0 {
		c.CooldownFactor = DefaultCooldownFactor
	}
	if c.MaxCooldown == 0 {
		c.MaxCooldown = max(DefaultMaxCooldown, c.Cooldown)
	}
	if c.SuccessMemory == 0 {
		c.SuccessMemory = DefaultSuccessMemory
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
	case !(c.CooldownFactor >= 1) || math.IsInf(c.CooldownFactor, 1):
		return fmt.Errorf("CooldownFactor %v: want a finite number at least 1", c.CooldownFactor)
	case c.MaxCooldown < c.Cooldown:
		return fmt.Errorf("MaxCooldown %v: want at least Cooldown (%v)", c.MaxCooldown, c.Cooldown)
	case c.SuccessMemory > 0 && c.SuccessMemory < time.Millisecond:
		return fmt.Errorf("SuccessMemory %v: want at least 1ms, or negative to disable the cold-start cap", c.SuccessMemory)
	}
	return nil
}

// State is a breaker's state.
type State string

// The states of a breaker.
const (
	// Closed admits every request and counts consecutive server-side failures; while it has
	// seen no Success within Config.SuccessMemory it admits at most Threshold unreported
	// requests (the cold-start cap).
	Closed State = "closed"
	// Open refuses every request until its cooldown ends.
	Open State = "open"
	// HalfOpen admits exactly one request (the probe) across all processes at a time; the
	// probe's outcome closes or re-opens the breaker.
	HalfOpen State = "half_open"
)

var states = [...]State{Closed, Open, HalfOpen}

// Outcome is what an admitted request's response says about the provider's health.
type Outcome int

// The outcomes a caller reports.
const (
	// Success is a response that shows the provider serving: a 2xx. It resets the closed
	// breaker's failure count and lifts the cold-start cap; a probe's success closes the breaker
	// and resets the cooldown backoff.
	Success Outcome = iota + 1
	// Failure is a server-side failure: 5xx, 529, a timeout, a connection error. It counts
	// toward Threshold; a probe's failure re-opens the breaker for a cooldown CooldownFactor
	// times the last one's, at most MaxCooldown.
	Failure
	// Neutral says nothing about the provider's health: a 4xx, a 429 with Retry-After (the
	// limiter's business), a request canceled or never sent. It neither counts nor resets the
	// failure count, so failures interleaved with 429s still open the breaker. A probe
	// reporting Neutral hands the probe on: the next caller becomes the probe at once; a
	// cold-start admission reporting Neutral frees its slot.
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

// arg is the outcome as reportScript's argument: String's, boxed as constants are (without
// allocating). o is one of the three.
func (o Outcome) arg() any {
	switch o {
	case Success:
		return "success"
	case Failure:
		return "failure"
	}
	return "neutral"
}

// Breaker is the circuit breaker of every provider key, shared by all processes through Redis.
// It is safe for concurrent use; two Breakers on the same Redis and prefix (in one process or
// many) share all state.
type Breaker struct {
	rdb redis.UniversalClient
	cfg Config
	// TTLs derived from cfg, in ms: a closed key, and a closed key holding cold-start leases.
	closedTTL, leaseTTL int64
	// memory is cfg.SuccessMemory in µs, 0 when the cap is disabled; refresh is how old the
	// recorded Success must be before a warm breaker records another.
	memory, refresh int64
	// wakes are the channels Listen closes when a Report announces a wake-up.
	wakes wakeHub
	// calls names each admission and report (see allowScript and reportScript).
	calls *redisscript.CallIDs
	// args are the scripts' arguments that the configuration alone decides, boxed once by New.
	args scriptArgs
}

// scriptArgs are allowScript's and reportScript's arguments that the configuration alone decides,
// boxed once (New): formatting them at every call took as many instructions as the calls saved
// by not allocating them. Each holds the value (and dynamic type) the call sites passed.
type scriptArgs struct {
	probeTimeout, recheck, probeAbandoned, threshold, memory, leaseTTL   any
	cooldown, closedTTL, abandoned, refresh, cooldownFactor, maxCooldown any
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
	b := &Breaker{rdb: rdb, cfg: c, calls: redisscript.NewCallIDs()}
	b.closedTTL = max(c.IdleTTL, c.SuccessMemory).Milliseconds()
	b.leaseTTL = max(b.closedTTL, c.ProbeTimeout.Milliseconds())
	if c.SuccessMemory > 0 {
		b.memory = c.SuccessMemory.Microseconds()
		b.refresh = max(b.memory/successRefreshDiv, 1)
	}
	b.args = scriptArgs{
		probeTimeout: c.ProbeTimeout.Microseconds(), recheck: c.Recheck.Microseconds(),
		probeAbandoned: (c.ProbeTimeout + abandonedTTL).Milliseconds(), threshold: c.Threshold,
		memory: b.memory, leaseTTL: b.leaseTTL, cooldown: c.Cooldown.Microseconds(), closedTTL: b.closedTTL,
		abandoned: abandonedTTL.Milliseconds(), refresh: b.refresh,
		cooldownFactor: strconv.FormatFloat(c.CooldownFactor, 'g', -1, 64), maxCooldown: c.MaxCooldown.Microseconds(),
	}
	return b, nil
}

// Circuit is the breaker of one provider key. Make it with Breaker.Circuit; it is cheap,
// holds no state of its own and is safe for concurrent use.
type Circuit struct {
	b     *Breaker
	name  string
	tag   string // the credential's hash tag, the wake-up message
	key   string // the breaker hash
	lease string // the cold-start leases
	// keys are key and lease, as every script of the circuit takes them (boxed once, read only).
	keys []any
	// states is the credential's llmq_breaker_state series, looked up once.
	states *stateSeries
}

// Circuit returns the breaker of the provider key id. id is only hashed (the key looks like
// "<prefix>{<sha256 hex of id>}:cb", beside the limiter's keys): it never reaches Redis, logs or
// metrics. Pass the API key itself, so that two credential names sharing one key share its
// breaker. name is the credential's name, used only as the metrics label.
func (b *Breaker) Circuit(id, name string) *Circuit {
	return b.CircuitByTag(redisscript.CredentialTag(id), name)
}

// CircuitByTag is Circuit for a process that knows the credential's tag (redisscript.CredentialTag,
// as the workers publish it under redisscript.CredentialIndexKey) but not its key.
func (b *Breaker) CircuitByTag(tag, name string) *Circuit {
	c := &Circuit{b: b, name: name, tag: tag, key: breakerKey(b.cfg.Prefix, tag),
		lease: leaseKey(b.cfg.Prefix, tag), states: &stateSeries{}}
	c.keys = []any{c.key, c.lease}
	return c
}

// Admission is Allow's answer.
type Admission struct {
	// Allowed reports whether the request may be sent now. When it is, the caller must Report
	// its outcome with this Admission (Neutral if it ends up not sending it).
	Allowed bool
	// Probe reports whether this request is the half-open breaker's single probe.
	Probe bool
	// Capped reports a refusal by the closed breaker's cold-start cap (Config.SuccessMemory):
	// the provider is not known to be down, only not yet known to be up, and Threshold
	// requests are already out to find out. The caller should wait for RetryAt (Recheck) on
	// this credential, not fail over as it would from an open breaker.
	Capped bool
	// State is the breaker's state as this call left it.
	State State
	// RetryAt is when a refused caller should ask again: the end of the cooldown while open, a
	// short re-check (Config.Recheck, capped at the probe's deadline) while a probe is out or
	// the cold-start cap is full (capped at the first slot's deadline).
	// Zero when Allowed; UTC otherwise. The caller defers the job without counting an attempt.
	RetryAt time.Time
	// Wait is RetryAt less now, on the breaker's clock (Redis TIME unless Config.Now is set):
	// hand this to a scheduler rather than comparing RetryAt with a local clock.
	Wait time.Duration

	// gen is the breaker's generation this admission belongs to; Report ignores reports from
	// ended generations.
	gen int64
	// lease is the cold-start slot this admission holds (0: none); Report frees it.
	lease int64
}

// ColdStart reports whether the admission holds one of a cold closed breaker's slots (the
// cold-start cap, see Config.SuccessMemory): callers beyond the cap wait for the first Success,
// so a caller that knows the provider answers before the request ends (a stream's 2xx headers)
// may Report Success then, and Report a Failure later if the request still fails.
func (a Admission) ColdStart() bool { return a.lease != 0 }

// Allow asks whether a request may be sent: a closed breaker admits everyone (but, cold, only
// Threshold unreported requests at a time: see Config.SuccessMemory); an open one refuses
// until its cooldown ends, then makes exactly one caller, across all processes, the probe (the
// breaker turns half-open) and refuses the others until the probe reports or ProbeTimeout
// passes. A refusal is not an error: Allowed is false and RetryAt says when to ask again. Allow
// returns an error only when Redis fails (the Admission is then zero). On a warm closed breaker
// it writes nothing.
func (c *Circuit) Allow(ctx context.Context) (Admission, error) {
	b := c.b
	cfg := &b.cfg
	var args redisscript.Args // the time and call id formatted into one buffer
	ca := &b.args
	res, err := allowScript.Run(ctx, b.rdb, c.keys, args.Now(cfg.Now), ca.probeTimeout, ca.recheck,
		ca.probeAbandoned, ca.threshold, ca.memory, ca.leaseTTL, args.Call(b.calls)).Slice()
	if err != nil {
		return Admission{}, fmt.Errorf("breaker allow: %w", err)
	}
	if len(res) != 9 {
		return Admission{}, fmt.Errorf("breaker allow: unexpected reply %v", res)
	}
	a := Admission{
		Allowed: redisscript.Int(res[0]) == 1,
		Probe:   redisscript.Int(res[1]) == 1,
		Capped:  redisscript.Int(res[8]) == 1,
		State:   State(redisscript.String(res[2])),
		gen:     redisscript.Int(res[5]),
		lease:   redisscript.Int(res[7]),
	}
	if at := redisscript.Int(res[3]); at > 0 {
		a.RetryAt = time.UnixMicro(at).UTC()
		a.Wait = max(time.Duration(at-redisscript.Int(res[4]))*time.Microsecond, 0)
	}
	m := cfg.Metrics
	m.setState(c.states, c.name, a.State)
	if redisscript.Int(res[6]) == 1 {
		m.transitioned(c.name, HalfOpen)
	}
	if !a.Allowed {
		m.rejected(c.name)
	}
	return a, nil
}

// Key is the circuit's hash in Redis, for a caller's own script that makes Allow's test for
// admitting without writing anything (limiter.AttemptOptions.Circuit): the hash's state field
// is absent or "closed" and, when SuccessMemory is positive, its ok field (µs) lies within
// SuccessMemory of now; its gen field (absent: 0) is then the generation to pass to
// ClosedAdmission. Any other state must go through Allow.
func (c *Circuit) Key() string { return c.key }

// SuccessMemory is the cold-start cap's memory (0: no cap; see Key).
func (c *Circuit) SuccessMemory() time.Duration { return time.Duration(c.b.memory) * time.Microsecond }

// ClosedAdmission is the Admission Allow returns when it admits a closed, warm breaker's request
// at generation gen, for a caller whose own script made that test (see Key); it records the
// state as Allow does. Report the request's outcome on it as on any other.
func (c *Circuit) ClosedAdmission(gen int64) Admission {
	c.b.cfg.Metrics.setState(c.states, c.name, Closed)
	return Admission{Allowed: true, State: Closed, gen: gen}
}

// Report records the outcome of a request Allow admitted, and returns the breaker's state after
// it. In a closed breaker, Threshold consecutive Failures open it (for Cooldown) and a Success
// resets the count and lifts the cold-start cap; any report frees the admission's cold-start
// slot. A probe's Success closes the breaker, clears the count and resets the cooldown; its
// Failure re-opens it for CooldownFactor times the last cooldown, at most MaxCooldown; its
// Neutral hands the probe to the next caller. Reports from admissions whose state has since
// ended are ignored: a request in flight when the breaker opened does not extend or re-open
// it, and a probe replaced after ProbeTimeout no longer decides. Reporting a refused
// Admission, or an Outcome that is not one of the three, is a programming error and returns an
// error without touching Redis. The Report of a probe or of a cold-start request also wakes
// the callers refused meanwhile, in every process (see Listen). Otherwise Report returns an
// error only when Redis fails.
func (c *Circuit) Report(ctx context.Context, a Admission, o Outcome) (State, error) {
	var st State
	call, err := c.ReportCall(a, o, &st)
	if err != nil {
		return "", err
	}
	if err := redisscript.Run(ctx, c.b.rdb, call); err != nil {
		return st, err
	}
	return st, nil
}

// ReportCall returns Report's work as a script call, for a caller that sends it in one round trip
// with others (redisscript.Run, on the breaker's Redis or a client of the same server). After the
// round trip, state holds the breaker's state (when state is not nil). Its error, and the call's,
// are Report's.
func (c *Circuit) ReportCall(a Admission, o Outcome, state *State) (redisscript.Call, error) {
	if !a.Allowed {
		return redisscript.Call{}, errors.New("breaker report: the admission was refused")
	}
	if o < Success || o > Neutral {
		return redisscript.Call{}, fmt.Errorf("breaker report: invalid outcome %d", int(o))
	}
	b := c.b
	cfg := &b.cfg
	var args redisscript.Args // the time, generation, lease and call id formatted into one buffer
	var id any = ""           // only a failure is counted by its id (see reportScript): a success needs none
	if o == Failure {
		id = args.Call(b.calls)
	}
	ca := &b.args
	return redisscript.Call{
		Script: reportScript,
		Keys:   c.keys,
		Args: []any{args.Now(cfg.Now), args.Int(a.gen), o.arg(), ca.threshold, ca.cooldown, ca.closedTTL,
			ca.abandoned, args.Int(a.lease), ca.memory, ca.refresh, ca.cooldownFactor, ca.maxCooldown,
			ca.leaseTTL, id},
		Done: func(ctx context.Context, cmd *redis.Cmd) error {
			res, err := cmd.Slice()
			if err != nil {
				return fmt.Errorf("breaker report: %w", err)
			}
			if len(res) != 2 {
				return fmt.Errorf("breaker report: unexpected reply %v", res)
			}
			st := State(redisscript.String(res[0]))
			if state != nil {
				*state = st
			}
			cfg.Metrics.setState(c.states, c.name, st)
			if to := redisscript.String(res[1]); to != "" {
				cfg.Metrics.transitioned(c.name, State(to))
			}
			if a.Probe || a.lease > 0 {
				// Callers refused while this request was out may be admitted now (or one of
				// them becomes the probe): wake them rather than let them wait out their Recheck.
				return c.publishWake(ctx)
			}
			return nil
		},
	}, nil
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
	// Capped reports a Closed breaker under the cold-start cap: no Success within
	// Config.SuccessMemory.
	Capped bool
	// InFlight is, while Capped, how many cold-start slots are out (admitted, not yet reported,
	// not yet expired).
	InFlight int
}

// Status reads the credential's breaker. It makes no transition and returns an error only when
// Redis fails.
func (c *Circuit) Status(ctx context.Context) (Status, error) {
	v, err := statusScript.Run(ctx, c.b.rdb, c.keys, c.b.nowArg(), c.b.memory).Slice()
	if err != nil {
		return Status{}, fmt.Errorf("breaker status: %w", err)
	}
	if len(v) != 6 {
		return Status{}, fmt.Errorf("breaker status: unexpected reply %v", v)
	}
	s := Status{State: Closed}
	if st := redisscript.String(v[0]); st != "" {
		s.State = State(st)
	}
	if us := redisscript.Int(v[1]); us > 0 {
		s.Since = time.UnixMicro(us).UTC()
	}
	if us := redisscript.Int(v[2]); us > 0 && s.State != Closed {
		s.Until = time.UnixMicro(us).UTC()
	}
	if s.State == Closed {
		s.Failures = int(redisscript.Int(v[3]))
		s.Capped = redisscript.Int(v[4]) == 1
		s.InFlight = int(redisscript.Int(v[5]))
	}
	c.b.cfg.Metrics.setState(c.states, c.name, s.State)
	return s, nil
}

// nowArg is the scripts' "now" argument (redisscript.NowArg of the injected clock).
func (b *Breaker) nowArg() string { return redisscript.NowArg(b.cfg.Now) }
