package executor

import (
	"context"
	"errors"
	"time"

	"github.com/llmq/llmq/internal/breaker"
	"github.com/llmq/llmq/internal/jobs"
	"github.com/llmq/llmq/internal/limiter"
	"github.com/llmq/llmq/internal/llm"
	"github.com/llmq/llmq/internal/redisscript"
	"github.com/llmq/llmq/internal/retrypolicy"
	"github.com/llmq/llmq/internal/tokens"
)

// afterCall does the bookkeeping of an attempt that was sent, in one Redis round trip: it tells
// the limiter what the attempt showed (the learned limit, a Retry-After push-back, the tokens the
// provider counted) and the breaker how it went; then it resumes a paused credential whose probe
// got through. (First attempts were counted for the retry budget when their slot was granted,
// see admitGate.) Errors are logged: the attempt's outcome matters more than bookkeeping.
//
// heard, when not nil, is what a streamed answer's headers told when they came
// (observeStreamStart): the limiter is not told again, as a stream that began with a 2xx has
// nothing more for it (a failure after is a cut or an error event, with no headers of its own);
// the breaker, which heard a Success then, hears only a failure; and a paused credential was
// resumed then.
func (e *Executor) afterCall(ctx context.Context, up Upstream, adm admission, job *jobs.Job, resp *llm.Response,
	callErr error, d retrypolicy.Decision, sent, now time.Time, heard *heardAtStart) {
	ctx = context.WithoutCancel(ctx)
	g := up.Gate
	if g == nil {
		e.reportBreaker(ctx, up, adm.breaker, breakerOutcome(d))
		return
	}
	o := observation(up, adm, resp, callErr, d, sent, now)
	var calls []redisscript.Call
	if heard == nil {
		calls = g.ObserveCalls(o)
	} else {
		<-heard.done
	}
	if call, ok := e.reconcileCall(ctx, up, adm, job, resp, callErr, o.StatusCode); ok {
		calls = append(calls, call)
	}
	if outcome := breakerOutcome(d); adm.breaker != nil && !heard.toldBreaker(outcome) {
		if call, ok := e.breakerCall(ctx, up, *adm.breaker, outcome); ok {
			calls = append(calls, call)
		}
	}
	// The breaker's keys live on the limiter's Redis (the worker gives both one server).
	if err := redisscript.Run(ctx, g.Redis(), calls...); err != nil {
		e.cfg.Logger.WarnContext(ctx, "after-call bookkeeping (limiter, breaker)", "credential", up.Name, "error", err)
	}
	if adm.pauseProbe.Granted() && callErr == nil && heard == nil {
		e.resumeAfterProbe(ctx, g, up, job)
	}
}

// resumeAfterProbe resumes a paused credential whose automatic probe got through.
func (e *Executor) resumeAfterProbe(ctx context.Context, g *limiter.Gate, up Upstream, job *jobs.Job) {
	var err error
	if e.cfg.Pauses != nil {
		// ctx outlives the delivery's cancellation (see afterCall), and the delivery waits
		// for this: bounded as its other statements are.
		rctx, cancel := e.storeCtx(ctx)
		_, err = e.cfg.Pauses.Resume(rctx, g)
		cancel()
	} else {
		_, err = g.Resume(ctx)
	}
	if err != nil {
		e.cfg.Logger.WarnContext(ctx, "resume after probe", "credential", up.Name, "error", err)
	} else {
		e.cfg.Logger.WarnContext(ctx, "credential resumed: the pause probe succeeded", "credential", up.Name, "job_id", job.ID)
	}
}

// breakerCall is the breaker's report of outcome for admission a, as a script call to send with
// the rest of the bookkeeping; false (logged) when the report cannot be made.
func (e *Executor) breakerCall(ctx context.Context, up Upstream, a breaker.Admission, o breaker.Outcome) (redisscript.Call, bool) {
	call, err := up.Circuit.ReportCall(a, o, nil)
	if err != nil {
		e.cfg.Logger.WarnContext(ctx, "breaker report", "credential", up.Name, "error", err)
		return redisscript.Call{}, false
	}
	return call, true
}

// heardAtStart is what a streamed answer's headers told the limiter and the breaker when they
// came (observeStreamStart).
type heardAtStart struct {
	done    chan struct{} // closed once told
	breaker bool          // the breaker was told a Success
}

// toldBreaker reports whether the breaker already heard what the attempt's outcome would tell it:
// the Success at the headers stands for a success or a neutral end, not for a failure. A nil h
// (nothing told at the headers) told nothing.
func (h *heardAtStart) toldBreaker(o breaker.Outcome) bool {
	return h != nil && h.breaker && o != breaker.Failure
}

// awaited reports whether other attempts on the credential wait for this one's news: the probe
// of a limit being learned, a cold breaker's start slot, a paused credential's probe. Only then
// does a stream's bookkeeping start at its headers (observeStreamStart), a round trip of its own;
// any other attempt's goes in one round trip after the call.
func (a admission) awaited() bool {
	return a.probe || a.pauseProbe.Granted() || (a.breaker != nil && a.breaker.ColdStart())
}

// observeStreamStart tells the limiter what a streamed answer's 2xx headers say as soon as they
// are in, beside the stream, instead of after it; so too a cold breaker's start slot, a Success,
// and a paused credential whose probe this is, its resume. While a limit is being learned every
// other attempt on the credential waits for its one probe to be observed, a cold breaker's for a
// first Success, a paused credential's for its probe; after the stream, that is as long as the
// stream lasts (minutes for a long answer). A 2xx's headers are what those waits are for: the
// provider answers, and its limits.
func (e *Executor) observeStreamStart(ctx context.Context, up Upstream, adm admission, s llm.StreamStart,
	sent time.Time, job *jobs.Job) *heardAtStart {
	ctx = context.WithoutCancel(ctx)
	g := up.Gate
	o := observation(up, adm, &llm.Response{StatusCode: s.StatusCode, RateLimit: s.RateLimit}, nil,
		retrypolicy.Decision{}, sent, e.cfg.Now())
	calls := g.ObserveCalls(o)
	h := &heardAtStart{done: make(chan struct{})}
	if adm.breaker != nil && adm.breaker.ColdStart() {
		// Not a warm breaker's admission: a Success resets the failure count, and a provider
		// whose streams all fail midway must still open the breaker. Nor a half-open probe's:
		// closing the breaker after an outage takes a whole answer.
		if call, ok := e.breakerCall(ctx, up, *adm.breaker, breaker.Success); ok {
			calls, h.breaker = append(calls, call), true
		}
	}
	go func() {
		defer close(h.done)
		if err := redisscript.Run(ctx, g.Redis(), calls...); err != nil {
			e.cfg.Logger.WarnContext(ctx, "stream start bookkeeping (limiter, breaker)", "credential", up.Name, "error", err)
		}
		if adm.pauseProbe.Granted() {
			e.resumeAfterProbe(ctx, g, up, job)
		}
	}()
	return h
}

// observation is what the attempt's answer (or failure) tells the limiter.
func observation(up Upstream, adm admission, resp *llm.Response, callErr error, d retrypolicy.Decision, sent, now time.Time) limiter.Observation {
	o := limiter.Observation{At: now, SentAt: sent, Seq: adm.seq, Grant: adm.grant}
	var rl llm.RateLimit
	if resp != nil {
		o.StatusCode, rl = resp.StatusCode, resp.RateLimit
	} else if se, ok := errors.AsType[*llm.StatusError](callErr); ok {
		o.StatusCode, rl = se.StatusCode, se.RateLimit
	}
	if rl.Known {
		o.HeadersKnown, o.Limit, o.Remaining, o.ResetAt = true, rl.Limit, rl.Remaining, rl.ResetAt
		o.ResetAbsolute, o.ResetGranularity = rl.ResetAbsolute, rl.ResetGranularity
	}
	o.Date = rl.Date // absolute resets, the tokens' too, are measured from it
	o.InputTokens, o.OutputTokens = tokenObservation(rl.Tokens.Input), tokenObservation(rl.Tokens.Output)
	if up.Kind == string(llm.KindOpenAI) {
		// Anthropic's tokens-* family reports its most restrictive limit, not a bucket.
		o.Tokens = tokenObservation(rl.Tokens.Combined)
	}
	if o.StatusCode == 429 && d.HasRetryAfter {
		o.RetryAfter, o.HasRetryAfter = d.RetryAfter, true
	}
	// OpenAI's 429 "Request too large for … (TPM)" refused the request for its size: not a sign
	// of the credential's rate (its headers are still learned).
	o.TooLarge = d.TooLarge
	return o
}

// reconcileCall is the call that trues the token buckets up to what the provider counted: the
// reported usage after an answer, nothing for a 429 (the provider charged nothing), the input
// alone for another error. A stream that failed partway after the provider reported its usage
// (Anthropic's message_start: llm.FailedUsage) is settled with the provider's input, not the
// estimate: an error event with the output reported, a cut stream (which may have generated more
// than it reported) and an error event that reported no output count with the output reservation
// kept. With no answer at all, or an answer that reports no usage (llm.Usage.Reported: stored as
// none), the reservation stays charged (the provider counted something, but what is unknown): ok
// is false then, and when no tokens were reserved. A usage that reports no input
// keeps the input estimate charged, one that reports no output count (llm.Usage.OutputUnreported)
// the output allowance.
func (e *Executor) reconcileCall(ctx context.Context, up Upstream, adm admission, job *jobs.Job, resp *llm.Response,
	callErr error, status int) (redisscript.Call, bool) {
	partial, partialKnown := llm.FailedUsage(callErr)
	partialKnown = partialKnown && resp == nil
	if adm.grant == 0 || (status == 0 && !partialKnown) {
		return redisscript.Call{}, false
	}
	est := adm.est
	if est == nil { // the slot was held by an earlier delivery: estimate again
		_, est = e.cost(up, job)
	}
	var actual tokens.Cost
	switch {
	case resp != nil && !resp.Usage.Reported():
		return redisscript.Call{}, false
	case resp != nil:
		// The input-token limit counts the cache's creation but not its reads; the estimate is
		// of the whole prompt, cached or not, and learns from the whole prompt read.
		actual = tokens.Cost{InputTokens: resp.Usage.LimitedInput(), OutputTokens: resp.Usage.OutputTokens}
		if est != nil && resp.Usage.OutputUnreported {
			// A usage without its output (a gateway's partial usage): the output stays charged
			// as reserved; refunded, the next requests would overdraw the output-token limit. A
			// usage reporting 0 output tokens (an empty answer) is refunded as reported.
			actual.OutputTokens = est.MaxOutput
		}
		switch {
		case est == nil:
		case resp.Usage.PromptInput() == 0:
			// A usage without its input (every prompt is at least a token): the input stays
			// charged as estimated, as with no usage at all; nothing to learn.
			actual.InputTokens = est.Input
		default:
			e.cfg.Estimator.Observe(up.Name, *est, resp.Usage.PromptInput())
		}
	case partialKnown:
		actual = tokens.Cost{InputTokens: partial.LimitedInput(), OutputTokens: partial.OutputTokens}
		if est != nil {
			if status == 0 || partial.OutputUnreported {
				// Cut: what was generated after the last report is unknown. Unreported (an
				// Anthropic error event before any message_delta): what was generated is unknown.
				actual.OutputTokens = max(actual.OutputTokens, est.MaxOutput)
			}
			e.cfg.Estimator.Observe(up.Name, *est, partial.PromptInput())
		}
	case status == 429:
	case est != nil:
		actual = tokens.Cost{InputTokens: est.Input}
	}
	call, ok, err := up.Gate.ReconcileCall(adm.grant, actual)
	if err != nil {
		e.cfg.Logger.WarnContext(ctx, "token reconcile", "credential", up.Name, "error", err)
	}
	return call, ok
}

func tokenObservation(t llm.TokenRateLimit) limiter.TokenObservation {
	if !t.Known {
		return limiter.TokenObservation{}
	}
	return limiter.TokenObservation{Known: true, Limit: t.Limit, Remaining: t.Remaining,
		RemainingGranularity: t.RemainingGranularity, ResetAt: t.ResetAt,
		ResetGranularity: t.ResetGranularity, ResetAbsolute: t.ResetAbsolute}
}
