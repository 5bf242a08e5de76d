package limiter

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/llmq/llmq/internal/redisscript"
	"github.com/llmq/llmq/internal/tokens"
)

// Config configures a Limiter. Zero fields take the defaults documented on each field; nil is
// accepted as all defaults.
type Config struct {
	// Prefix starts every key. Default "llmq:". Tests pass redistest.Prefix(t).
	Prefix string
	// Now is the clock. Nil (production): the scripts read Redis TIME, so every process shares
	// Redis's clock and local clock skew cannot make two processes disagree about the schedule.
	// Tests inject a clock; every process must then use the same one.
	Now func() time.Time
	// PhaseMargin delays every request that waits for a refill (not those the full bucket
	// holds) by this much, because the provider's bucket and ours are never exactly in phase:
	// its refill starts when our first request lands, requests take different times to reach it,
	// and clocks differ. Default 100ms; it costs PhaseMargin once per burst, not per request.
	// Negative disables it.
	PhaseMargin time.Duration
	// RateMargin spaces requests (1+RateMargin)/Rate apart instead of 1/Rate, so a provider
	// that refills a little slower than it says (or a learned rate a little high) does not drift
	// into 429s over a long run. Default 0.01 (1%: 80 ms over the 8 s of a 100-request herd at
	// 10/s). Negative disables it.
	RateMargin float64
	// ClockSkew is how far the provider's clock may be from ours. It widens what an absolute
	// reset time (Anthropic's) of a response without a Date (Observation.Date) says about the
	// rate; without it, a provider clock 100 ms behind makes the first response (one request
	// used, full again in 1/Rate) claim a rate many times the true one. A response with a Date is
	// measured on the provider's clock instead, whatever the offset. Default 100ms; negative
	// disables it.
	ClockSkew time.Duration
	// LearnTTL is how long learned knowledge lasts without a new observation; stale knowledge
	// then heals by probing again. It is also how long Current reports a configured limit after
	// its last Reserve. Default 10m.
	LearnTTL time.Duration
	// ProbeTTL is how long the single probe of an unknown limit may stay unanswered before
	// another request may probe (the caller crashed, or forgot to Observe). Default 30s: LLM
	// calls are slow.
	ProbeTTL time.Duration
	// PollInterval is the shortest time Reserve tells a caller to wait before asking again while
	// a limit is being learned. Default 10ms.
	PollInterval time.Duration
	// LearnHorizon is how far ahead slots are handed out under a learned limit (configured
	// limits have none). A slot handed out is fixed; keeping them close means a better
	// estimate, a change the provider makes, or the provider reporting more remaining than we
	// modelled applies to the queue at once. Callers further back are told when to ask again,
	// spread by their place in line and at least once a second. Default 250ms.
	LearnHorizon time.Duration
	// TokenMinute is the refill period of token limits: a bucket of N tokens per minute holds N
	// and refills N per TokenMinute. Default 1m (what providers mean); a simulator with a shortened
	// minute needs the same value here for configured token limits (learned ones read the refill
	// rate from the headers as well).
	TokenMinute time.Duration
	// TokenHorizon bounds how far ahead token buckets hand out slots: a slot that the tokens push
	// more than TokenHorizon ahead is granted only while no other such slot is pending (the others
	// are told to ask again, Granted false). Costs are estimates, reconciled after the answer;
	// keeping the queue close means a refund (a prompt smaller than estimated, a reply shorter
	// than max_tokens) applies to the next requests at once instead of after every slot handed
	// out. Default 1s; negative disables it (every slot is handed out at once, in order).
	TokenHorizon time.Duration
	// MaxRetryAfter caps how far one 429's Retry-After pushes the credential's shared schedule
	// back (see Observe): every tenant and worker waits for it, so a longer hint (a typo, a
	// hostile provider, "Retry-After: 99999999") stalls the credential this long at most.
	// Default 5m; at least 1s.
	MaxRetryAfter time.Duration
	// Fairness configures how attempts that name a Lane share the credential.
	Fairness Fairness
	// Budget configures the retry budget.
	Budget Budget
	// Metrics receives the limiter's metrics; nil records none.
	Metrics *Metrics
}

// Budget configures the shared retry budget: within any Window, granted retries may not exceed
// Floor + Ratio × first attempts.
type Budget struct {
	// Ratio is the retries allowed per first attempt. Default 0.1 (the SRE book's 10%).
	Ratio float64
	// Floor is the retries allowed per window whatever the traffic, so a quiet credential can
	// still retry. Default 10. Negative means 0.
	Floor int
	// Window is the sliding window. Default 60s.
	Window time.Duration
	// Buckets is how many counters the window is kept in; the window slides one bucket at a time.
	// Default 12 (5 s buckets for a 60 s window).
	Buckets int
}

// Defaults of Config.
const (
	DefaultPhaseMargin   = 100 * time.Millisecond
	DefaultRateMargin    = 0.01
	DefaultClockSkew     = 100 * time.Millisecond
	DefaultLearnTTL      = 10 * time.Minute
	DefaultProbeTTL      = 30 * time.Second
	DefaultPollInterval  = 10 * time.Millisecond
	DefaultLearnHorizon  = 250 * time.Millisecond
	DefaultTokenMinute   = time.Minute
	DefaultTokenHorizon  = time.Second
	DefaultMaxRetryAfter = 5 * time.Minute
)

// grantsKept is how many recent token grants can be reconciled; older records are dropped (their
// reservation then simply stays charged). It counts ids of the token hash's counter, which the
// pushes of token learning take too: a record goes once grantsKept ids were handed out after it.
const grantsKept = 4096

// A 429 with Retry-After caps the learned rate at (1-rateDecrease) of what was paced at, until
// the provider's limit changes or LearnTTL passes.
const rateDecrease = 0.1

func (c Config) withDefaults() Config {
	if c.Prefix == "" {
		c.Prefix = redisscript.DefaultPrefix
	}
	if c.PhaseMargin == 0 {
		c.PhaseMargin = DefaultPhaseMargin
	} else if c.PhaseMargin < 0 {
		c.PhaseMargin = 0
	}
	if c.RateMargin == 0 {
		c.RateMargin = DefaultRateMargin
	} else if c.RateMargin < 0 {
		c.RateMargin = 0
	}
	if c.ClockSkew == 0 {
		c.ClockSkew = DefaultClockSkew
	} else if c.ClockSkew < 0 {
		c.ClockSkew = 0
	}
	if c.LearnTTL == 0 {
		c.LearnTTL = DefaultLearnTTL
	}
	if c.ProbeTTL == 0 {
		c.ProbeTTL = DefaultProbeTTL
	}
	if c.PollInterval == 0 {
		c.PollInterval = DefaultPollInterval
	}
	if c.LearnHorizon == 0 {
		c.LearnHorizon = DefaultLearnHorizon
	}
	if c.TokenMinute == 0 {
		c.TokenMinute = DefaultTokenMinute
	}
	if c.TokenHorizon == 0 {
		c.TokenHorizon = DefaultTokenHorizon
	} else if c.TokenHorizon < 0 {
		c.TokenHorizon = 0
	}
	if c.MaxRetryAfter == 0 {
		c.MaxRetryAfter = DefaultMaxRetryAfter
	}
	c.Fairness = c.Fairness.withDefaults()
	if c.Budget.Ratio == 0 {
		c.Budget.Ratio = 0.1
	}
	if c.Budget.Floor == 0 {
		c.Budget.Floor = 10
	} else if c.Budget.Floor < 0 {
		c.Budget.Floor = 0
	}
	if c.Budget.Window == 0 {
		c.Budget.Window = time.Minute
	}
	if c.Budget.Buckets == 0 {
		c.Budget.Buckets = 12
	}
	return c
}

func (c Config) validate() error {
	switch {
	case c.RateMargin > 1 || math.IsNaN(c.RateMargin):
		return fmt.Errorf("RateMargin %v: want between 0 and 1", c.RateMargin)
	case c.LearnTTL < time.Second:
		return fmt.Errorf("LearnTTL %v: want at least 1s", c.LearnTTL)
	case c.ProbeTTL < 0:
		return fmt.Errorf("ProbeTTL %v: want positive", c.ProbeTTL)
	case c.PollInterval < time.Millisecond:
		return fmt.Errorf("PollInterval %v: want at least 1ms", c.PollInterval)
	case c.LearnHorizon < 0:
		return fmt.Errorf("LearnHorizon %v: want positive", c.LearnHorizon)
	case c.TokenMinute < time.Second:
		return fmt.Errorf("TokenMinute %v: want at least 1s", c.TokenMinute)
	case c.MaxRetryAfter < time.Second:
		return fmt.Errorf("MaxRetryAfter %v: want at least 1s", c.MaxRetryAfter)
	case c.Budget.Ratio < 0 || math.IsNaN(c.Budget.Ratio):
		return fmt.Errorf("Budget.Ratio %v: want positive", c.Budget.Ratio)
	case c.Budget.Window < time.Second:
		return fmt.Errorf("Budget.Window %v: want at least 1s", c.Budget.Window)
	case c.Budget.Buckets < 1 || c.Budget.Buckets > 600:
		return fmt.Errorf("Budget.Buckets %d: want 1..600", c.Budget.Buckets)
	}
	return c.Fairness.validate()
}

// Limiter is the admission control of every provider key, shared by all processes through
// Redis. It is safe for concurrent use; two Limiters on the same Redis and prefix (in one process
// or many) share all state.
type Limiter struct {
	rdb redis.UniversalClient
	cfg Config
	// offsets is what responses' Date headers proved about each credential's provider clock
	// against this process's: the one piece of state kept in the process, as it is its clock's.
	offsets *clockOffsets
	// calls names each reservation call (see reserveScript).
	calls *redisscript.CallIDs
	// args are the scripts' arguments cfg alone decides.
	args scriptArgs
}

// scriptArgs are the scripts' arguments that the configuration alone decides, formatted and boxed
// once by New: formatting each float and boxing each integer again for every call was a share of
// a job's allocations (issue 23). Each holds the value (and dynamic type) the call sites passed.
type scriptArgs struct {
	phaseMargin, rateMargin, learnTTL, probeTTL, pollInterval, learnHorizon any
	tokenMinute, tokenHorizon                                               any
	budgetWindow, budgetBuckets, budgetRatio, budgetFloor                   any
	minShareNormal, minShareLow, fairHorizon, ticketGrace, maxRecheck       any
	rateDecrease                                                            any
}

// newScriptArgs is c's scriptArgs.
func newScriptArgs(c *Config) scriptArgs {
	b, f := &c.Budget, &c.Fairness
	return scriptArgs{
		phaseMargin: micros(c.PhaseMargin), rateMargin: fmtFloat(c.RateMargin), learnTTL: micros(c.LearnTTL),
		probeTTL: micros(c.ProbeTTL), pollInterval: micros(c.PollInterval), learnHorizon: micros(c.LearnHorizon),
		tokenMinute: micros(c.TokenMinute), tokenHorizon: micros(c.TokenHorizon),
		budgetWindow: micros(b.Window), budgetBuckets: b.Buckets, budgetRatio: fmtFloat(b.Ratio), budgetFloor: b.Floor,
		minShareNormal: fmtFloat(f.MinShareNormal), minShareLow: fmtFloat(f.MinShareLow), fairHorizon: micros(f.Horizon),
		ticketGrace: micros(f.TicketGrace), maxRecheck: micros(f.MaxRecheck),
		rateDecrease: fmtFloat(rateDecrease),
	}
}

// New returns a Limiter over rdb. cfg may be nil. It returns an error naming the field when cfg
// is invalid; it does not contact Redis.
func New(rdb redis.UniversalClient, cfg *Config) (*Limiter, error) {
	if rdb == nil {
		return nil, errors.New("new limiter: nil redis client")
	}
	var c Config
	if cfg != nil {
		c = *cfg
	}
	c = c.withDefaults()
	if err := c.validate(); err != nil {
		return nil, fmt.Errorf("new limiter: %w", err)
	}
	return &Limiter{rdb: rdb, cfg: c, offsets: &clockOffsets{byTag: map[string]clockOffset{}},
		calls: redisscript.NewCallIDs(), args: newScriptArgs(&c)}, nil
}

// Gate is the limiter of one provider key. Make it with Limiter.Gate; it is cheap,
// holds no state of its own but its credential's metric series, and is safe for concurrent use.
type Gate struct {
	l    *Limiter
	name string
	tag  string
	// series is the credential's metric series, looked up once each (nil: no metrics).
	series *gateSeries
	// keys are the credential's Redis keys that every reservation and report names.
	keys gateKeys
}

// gateKeys are a gate's Redis keys, built once in GateByTag: a reservation names up to nine of
// them and each was a string built, then boxed, at every call. Each is a string, boxed once as
// the scripts take their keys (redisscript.Script.Run).
type gateKeys struct {
	rate, token, grant, pause, budget any
	fair, fairLanes, fairDeadline     any
	// fairLane is the prefix of a lane's key: fairLane + Lane.name(); fairLaneArg is it boxed, an
	// argument of reserveScript.
	fairLane    string
	fairLaneArg any
	// rateOnly, rateToken and tokenGrant are the KEYS of the calls that name those: read only,
	// shared by every call.
	rateOnly, rateToken, tokenGrant []any
}

// Gate returns the limiter of the provider key id. id is only hashed (keys look like
// "<prefix>{<sha256 hex of id>}:rl"): it never reaches Redis, logs or metrics. Pass the API key
// itself, so that two credential names sharing one key share its limit. name is the
// credential's name, used only as the metrics label.
func (l *Limiter) Gate(id, name string) *Gate {
	return l.GateByTag(redisscript.CredentialTag(id), name)
}

// GateByTag is Gate for a process that knows the credential's tag (redisscript.CredentialTag,
// as the workers publish it under redisscript.CredentialIndexKey) but not its key.
func (l *Limiter) GateByTag(tag, name string) *Gate {
	p := l.cfg.Prefix
	keys := gateKeys{
		rate: rateKey(p, tag), token: tokenKey(p, tag), grant: grantKey(p, tag),
		pause: pauseKey(p, tag), budget: budgetKey(p, tag), fair: fairKey(p, tag),
		fairLanes: fairLanesKey(p, tag), fairDeadline: fairDeadlineKey(p, tag),
		fairLane: fairLaneKey(p, tag),
	}
	keys.fairLaneArg = keys.fairLane
	keys.rateOnly = []any{keys.rate}
	keys.rateToken = []any{keys.rate, keys.token}
	keys.tokenGrant = []any{keys.token, keys.grant}
	return &Gate{l: l, name: name, tag: tag, series: newGateSeries(l.cfg.Metrics, name), keys: keys}
}

// Name is the credential name given to Limiter.Gate.
func (c *Gate) Name() string { return c.name }

// Tag is the credential's Redis tag (redisscript.CredentialTag of its id): what identifies its
// shared state, never the key itself.
func (c *Gate) Tag() string { return c.tag }

// Redis is the client the limiter runs its scripts on: send ObserveCalls and ReconcileCall with
// it (redisscript.Run), together with other calls to the same server.
func (c *Gate) Redis() redis.UniversalClient { return c.l.rdb }

// Limit is a provider's request limit: a token bucket holding Burst requests, refilled at Rate
// per second; and optionally its token limits, each a bucket holding that many tokens and
// refilled as many per minute (Config.TokenMinute). Token limits apply only to ReserveCost.
type Limit struct {
	// Rate is requests per second.
	Rate float64
	// Burst is how many requests may go at once from a full bucket. 0 with a Rate means 1.
	Burst int
	// InputTokensPerMinute limits input (prompt) tokens; 0 means not configured (learned from
	// the headers when the provider sends them).
	InputTokensPerMinute float64
	// OutputTokensPerMinute limits output tokens, reserved as max_tokens before the call and
	// trued up to the usage after it; 0 means not configured.
	OutputTokensPerMinute float64
	// TokensPerMinute limits input and output tokens together (OpenAI's token limit); 0 means not
	// configured.
	TokensPerMinute float64
}

func (l Limit) valid() bool {
	bad := func(f float64) bool { return f < 0 || math.IsNaN(f) || math.IsInf(f, 0) }
	return !bad(l.Rate) && l.Burst >= 0 && !bad(l.InputTokensPerMinute) && !bad(l.OutputTokensPerMinute) &&
		!bad(l.TokensPerMinute)
}

// Source says where a Limit comes from.
type Source string

// Sources of a Limit.
const (
	// SourceConfigured: the credential's configuration.
	SourceConfigured Source = "configured"
	// SourceLearned: the provider's rate-limit headers (Rate 0: the burst is known, the rate not
	// yet).
	SourceLearned Source = "learned"
	// SourceUnknown: nothing is known.
	SourceUnknown Source = "unknown"
)

// Reservation is Reserve's answer.
type Reservation struct {
	// Granted reports whether a send slot was taken. When false, nothing was reserved (the limit
	// is being learned, or a learned slot lies beyond the horizon): call Reserve again after
	// Wait.
	Granted bool
	// SendAt is when the request may be sent (Granted) or when to ask again (not Granted), on the
	// limiter's clock (Redis TIME unless Config.Now is set).
	SendAt time.Time
	// Wait is SendAt minus the limiter's now. Sleep Wait rather than comparing SendAt with a
	// local clock, which may be skewed from Redis's.
	Wait time.Duration
	// Probe is true when the limit is unknown and this request is the one allowed out to learn
	// it. Observe its response (or its failure) promptly: everybody else waits for it.
	Probe bool
	// Limit is the request limit the slot was computed with, without margins (Rate 0: not
	// known); its token fields are zero (the token limits are in Tokens).
	Limit Limit
	// Source is where Limit comes from.
	Source Source
	// Seq identifies the slot to Observe (opaque): copy it into Observation.Seq. 0 when not
	// Granted.
	Seq int64
	// Cost is the cost ReserveCost was asked for (zero for Reserve).
	Cost tokens.Cost
	// Paused is the credential's pause episode when AttemptOptions.UnlessPaused refused the
	// ask (Granted false, nothing reserved, SendAt and Wait zero); the zero PauseState otherwise.
	Paused PauseState
	// PauseUnknown reports that AttemptOptions.PauseDurable refused the ask because Redis holds
	// no pause state for the credential (PauseState.Unknown): nothing was reserved. Restore the
	// state (RestorePause) and ask again.
	PauseUnknown bool
	// Grant identifies the tokens charged for this slot, to pass to Reconcile after the answer;
	// 0 when no token bucket was charged (Reserve, no token limit known, or not Granted).
	Grant int64
	// Tokens is the token limits the slot was computed with (ReserveCost only).
	Tokens TokenBuckets
	// ReportSend is non-zero on a slot a full bucket held (a burst's) when
	// AttemptOptions.ReportSend asked for it: pass it to Gate.Sent just before sending the request.
	ReportSend int64
	// CircuitRefused reports that AttemptOptions.Circuit found the breaker not closed and warm:
	// nothing was reserved or checked (not even the pause); ask the breaker itself.
	CircuitRefused bool
	// CircuitGen is the breaker's generation when AttemptOptions.Circuit found it closed and warm
	// (breaker.Circuit.ClosedAdmission makes the admission to report on).
	CircuitGen int64
}

// Reserve atomically takes the next send slot of the credential (one Lua script, GCRA): a burst
// of N requests gets the first Burst at once and then one every 1/Rate (plus the margins), however
// many processes share the credential. A taken slot is the caller's: send at SendAt, not before,
// and do not Reserve again for the same attempt.
//
// lim is the configured limit; the zero Limit means not configured, use what was learned from
// Observe: while nothing is known, one probe goes out at a time and the others are told to ask
// again shortly (Granted false); once learned, slots more than LearnHorizon ahead are not handed
// out either (Granted false, ask again after Wait). Observe the outcome of every granted slot.
//
// It returns an error when lim is invalid or Redis fails; no slot is taken then.
//
// Reserve takes no tokens: the token fields of lim are ignored (see ReserveCost).
func (c *Gate) Reserve(ctx context.Context, lim Limit) (Reservation, error) {
	if !lim.valid() {
		return Reservation{}, fmt.Errorf("reserve: invalid limit %+v", lim)
	}
	return c.reserve(ctx, lim, tokens.Cost{}, AttemptOptions{})
}

// AttemptOptions are duties of an attempt's admission that ReserveAttempt does in the same
// script as the reservation, saving their round trips on every job.
type AttemptOptions struct {
	// UnlessPaused refuses while the credential is paused (see Pause): nothing is reserved and
	// Reservation.Paused says why. It is Paused and the reservation in one atomic step.
	UnlessPaused bool
	// PauseDurable, with UnlessPaused, also refuses when Redis holds no pause state for the
	// credential at all (Reservation.PauseUnknown): for a caller that keeps pauses durably
	// (internal/credpause), a missing state is one Redis lost, which may have been a pause.
	PauseDurable bool
	// FirstAttempt counts a first attempt in the retry budget (RecordAttempt) when, and only
	// when, a slot is granted: an ask that is refused or told to come back counts nothing.
	FirstAttempt bool
	// Lane, when set, queues the attempt fairly among the credential's other waiting attempts
	// (see Lane): it is granted a slot only when its turn comes within Fairness.Horizon, else told
	// to ask again (Granted false) with the same Lane. It applies while the request limit is
	// known (configured or learned); a limit being learned goes one probe at a time as before.
	Lane *Lane
	// ReportSend promises that a slot granted with a non-zero Reservation.ReportSend is reported
	// by Gate.Sent just before its request leaves. The slots a full bucket holds (a burst) are
	// then reported, and slots that need a refill wait (Granted false, ask again shortly) until
	// the burst's every report is in, or a second after its last grant: the provider's bucket
	// refills from when the burst's requests reach it, which may be well after their grants (the
	// caller's bookkeeping before the send); a schedule counted from the grants then sends the
	// first refill slots early.
	ReportSend bool
	// Circuit, when set, first makes the credential's circuit breaker's own test for admitting
	// without writing (closed, and not under its cold-start cap), in the same script: the breaker's
	// admission and the slot in one round trip, the breaker still deciding before anything is
	// reserved. When the test fails nothing is done (Reservation.CircuitRefused).
	Circuit *CircuitCheck
}

// CircuitCheck names a circuit breaker's state for AttemptOptions.Circuit (breaker.Circuit's Key
// and SuccessMemory). The hash must be on the gate's Redis, in its hash slot.
type CircuitCheck struct {
	// Key is the breaker's hash.
	Key string
	// SuccessMemory is its cold-start cap's memory: a closed breaker with no Success recorded
	// within it is cold. 0: no cap.
	SuccessMemory time.Duration
}

// reserve runs reserveScript; a zero cost runs it exactly as before token limits existed.
func (c *Gate) reserve(ctx context.Context, lim Limit, cost tokens.Cost, opts AttemptOptions) (Reservation, error) {
	if lim.Rate > 0 && lim.Burst == 0 {
		lim.Burst = 1
	}
	ca := &c.l.args
	keys := make([]any, 0, 10) // rate, token, grant, pause, budget, 4 fair, circuit
	keys = append(keys, c.keys.rate)
	// The arguments that change at every call are formatted into one buffer (redisscript.Args):
	// the time and call id, the limit and the cost took a string or a boxed integer each.
	var a redisscript.Args
	args := make([]any, 0, 48) // ARGV[1..43] at most
	args = append(args, a.NowCall(c.l.cfg.Now, c.l.calls), a.Float(lim.Rate), a.Int(int64(lim.Burst)),
		ca.phaseMargin, ca.rateMargin, ca.learnTTL, ca.probeTTL, ca.pollInterval, ca.learnHorizon)
	gated := opts != (AttemptOptions{})
	if cost != (tokens.Cost{}) || gated {
		keys = append(keys, c.keys.token, c.keys.grant)
	}
	if cost != (tokens.Cost{}) {
		in, out := int64(cost.InputTokens), int64(cost.OutputTokens)
		args = append(args, "1",
			a.Float(lim.InputTokensPerMinute), a.Float(lim.OutputTokensPerMinute), a.Float(lim.TokensPerMinute),
			a.Int(in), a.Int(out), a.Int(in+out),
			ca.tokenMinute, ca.tokenHorizon, grantsKept,
			a.Int(int64(cost.FitInput())), a.Int(int64(cost.FitInput())+out))
	} else if gated {
		args = append(args, "", "", "", "", "", "", "", "", "", "", "", "") // ARGV[10..21]: no tokens
	}
	if gated {
		keys = append(keys, c.keys.pause, c.keys.budget)
		unlessPaused := flag(opts.UnlessPaused)
		if opts.UnlessPaused && opts.PauseDurable {
			unlessPaused = "2"
		}
		args = append(args, unlessPaused, flag(opts.FirstAttempt),
			ca.budgetWindow, ca.budgetBuckets, ca.budgetRatio, ca.budgetFloor)
	}
	if opts.Lane != nil {
		if err := opts.Lane.valid(); err != nil {
			return Reservation{}, fmt.Errorf("reserve: %w", err)
		}
		keys = c.appendFairKeys(keys, &a, opts.Lane)
	}
	args = c.appendAnchorArgs(args, &a, opts)
	if opts.Circuit != nil {
		for len(args) < 41 { // ARGV[28..41]: no lane, no report of the send
			args = append(args, "")
		}
		keys = append(keys, a.Text(opts.Circuit.Key))
		args = append(args, "1", a.Int(micros(opts.Circuit.SuccessMemory)))
	}
	res, err := reserveScript.Run(ctx, c.l.rdb, keys, args...).Slice()
	if err != nil {
		return Reservation{}, fmt.Errorf("reserve: %w", err)
	}
	if len(res) == 1 && redisscript.Int(res[0]) == -3 {
		return Reservation{CircuitRefused: true}, nil
	}
	if len(res) == 1 && redisscript.Int(res[0]) == -4 {
		return Reservation{PauseUnknown: true}, nil
	}
	if len(res) == 4 && redisscript.Int(res[0]) == -1 {
		bucket := tokens.Bucket(redisscript.String(res[1]))
		return Reservation{}, &tokens.TooLargeError{Bucket: bucket, Cost: int(redisscript.Int(res[2])),
			Capacity: int(redisscript.Int(res[3])), Learned: lim.configured(bucket) == 0}
	}
	if len(res) == 4 && redisscript.Int(res[0]) == -2 {
		us, _ := strconv.ParseInt(redisscript.String(res[1]), 10, 64)
		c.series.setPaused(true)
		return Reservation{Paused: PauseState{Paused: true, Since: time.UnixMicro(us), Reason: redisscript.String(res[2]),
			FirstJobID: redisscript.String(res[3])}}, nil
	}
	if opts.UnlessPaused {
		c.series.setPaused(false)
	}
	if len(res) < 8 {
		return Reservation{}, fmt.Errorf("reserve: unexpected reply %v", res)
	}
	send, now := redisscript.Int(res[1]), redisscript.Int(res[2])
	rate, _ := strconv.ParseFloat(redisscript.String(res[4]), 64)
	r := Reservation{
		Granted: redisscript.Int(res[0]) == 1,
		SendAt:  time.UnixMicro(send),
		Wait:    time.Duration(send-now) * time.Microsecond,
		Probe:   redisscript.Int(res[3]) == 1,
		Limit:   Limit{Rate: rate, Burst: int(redisscript.Int(res[5]))},
		Source:  Source(redisscript.String(res[6])),
		Seq:     redisscript.Int(res[7]),
		Cost:    cost,
	}
	if len(res) >= 10 {
		r.Grant = redisscript.Int(res[8])
		r.Tokens = parseTokenLimits(redisscript.String(res[9]))
	}
	if len(res) >= 11 {
		r.ReportSend = redisscript.Int(res[10])
	}
	if len(res) >= 12 {
		r.CircuitGen = redisscript.Int(res[11])
	}
	c.series.reserved(r)
	return r, nil
}

// Acquire calls Reserve until a slot is granted, sleeping (in real time) between calls while
// each wait to ask again is at most maxWait. It does not wait for SendAt: the caller sleeps
// r.Wait, or hands a long wait to its scheduler and sends at SendAt. When the next ask would be
// further than maxWait away it returns that ungranted Reservation, so the caller can reschedule
// the job instead of holding a worker. It returns ctx's error when ctx ends first.
func (c *Gate) Acquire(ctx context.Context, lim Limit, maxWait time.Duration) (Reservation, error) {
	for {
		r, err := c.Reserve(ctx, lim)
		if err != nil || r.Granted || r.Wait > maxWait {
			return r, err
		}
		t := time.NewTimer(r.Wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return Reservation{}, fmt.Errorf("acquire: %w", context.Cause(ctx))
		case <-t.C:
		}
	}
}

// Current returns the limit in force for the credential and its source: the configured limit if
// a Reserve passed one within LearnTTL, else the learned one (Rate 0 while only the burst is
// known), else SourceUnknown. It returns an error only when Redis fails.
func (c *Gate) Current(ctx context.Context) (Limit, Source, error) {
	cfg := &c.l.cfg
	res, err := currentScript.Run(ctx, c.l.rdb, []string{rateKey(cfg.Prefix, c.tag)},
		c.l.nowArg(), micros(cfg.LearnTTL)).Slice()
	if err != nil {
		return Limit{}, "", fmt.Errorf("current limit: %w", err)
	}
	if len(res) != 3 {
		return Limit{}, "", fmt.Errorf("current limit: unexpected reply %v", res)
	}
	rate, _ := strconv.ParseFloat(redisscript.String(res[1]), 64)
	return Limit{Rate: rate, Burst: int(redisscript.Int(res[2]))}, Source(redisscript.String(res[0])), nil
}

// Now returns the limiter's clock as the credential's scripts read it: Redis TIME (Config.Now
// when set), the clock Reservation.SendAt is on. A send time kept elsewhere (a slot held in a job
// row) is to be waited for on it, never on a local clock, which may be skewed from Redis's: a
// worker whose clock runs ahead would send before the slot. It returns an error only when Redis
// fails.
func (c *Gate) Now(ctx context.Context) (time.Time, error) {
	us, err := clockScript.Run(ctx, c.l.rdb, []string{rateKey(c.l.cfg.Prefix, c.tag)}, c.l.nowArg()).Int64()
	if err != nil {
		return time.Time{}, fmt.Errorf("read the limiter's clock: %w", err)
	}
	return time.UnixMicro(us), nil
}

// nowArg is the scripts' "now" argument (redisscript.NowArg of the injected clock).
func (l *Limiter) nowArg() string { return redisscript.NowArg(l.cfg.Now) }

// localNow is the caller-side clock, used to turn an Observation's times into durations.
func (l *Limiter) localNow() time.Time {
	if l.cfg.Now != nil {
		return l.cfg.Now()
	}
	return time.Now()
}

func micros(d time.Duration) int64 { return d.Microseconds() }

// flag is a boolean script argument: "1" or "", boxed as constants are (without allocating; a
// string variable boxed allocates its header).
func flag(b bool) any {
	if b {
		return "1"
	}
	return ""
}

func fmtFloat(f float64) string { return strconv.FormatFloat(f, 'g', -1, 64) }
