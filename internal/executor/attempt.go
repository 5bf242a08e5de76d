package executor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/llmq/llmq/internal/alert"
	"github.com/llmq/llmq/internal/deltastream"
	"github.com/llmq/llmq/internal/gostack"
	"github.com/llmq/llmq/internal/jobs"
	"github.com/llmq/llmq/internal/llm"
	"github.com/llmq/llmq/internal/retrypolicy"
)

// begin marks the job running, counts the attempt and takes its lease (jobs.Store.BeginAttempt).
// Another delivery's live lease defers this one; a job that ended meanwhile needs nothing more.
func (e *Executor) begin(ctx context.Context, job *jobs.Job, up Upstream, adm admission) (*jobs.Job, error) {
	request := job.Request
	t0 := e.cfg.Now()
	bctx, cancel := e.storeCtx(ctx)
	begun, err := e.cfg.Store.BeginAttempt(bctx, job.ID)
	cancel()
	e.timed(StageBegin, t0)
	if err != nil {
		rel := adm
		var took bool
		var terr error
		if adm.held {
			took, terr = e.tookEndedSlot(ctx, job, err)
		}
		if adm.held && !took {
			// A slot held in the row is the row's: it still holds it (the store failed, and the
			// retried delivery sends it), or another delivery took it with the lease. Whichever
			// sends it reconciles its tokens; refunded here, they would never be charged. An
			// ended job's slot is given back by whoever takes it from the row (giveBackEnded).
			rel.grant = 0
		}
		e.release(ctx, up, rel)
		leased, isLeased := errors.AsType[*jobs.LeasedError](err)
		switch {
		case isLeased:
			return nil, leasedDefer(e.cfg.Now(), leased.Until)
		case errors.Is(err, jobs.ErrNotRunnable) && terr != nil:
			// The ended job's slot is still in its row: this delivery comes back (asynq's retry)
			// to give it back, as no other task of the job may be left to.
			return nil, terr
		case errors.Is(err, jobs.ErrNotRunnable):
			return nil, errHandled
		}
		return nil, err
	}
	begun.Request = request // BeginAttempt leaves the (unchanging) body where Get read it
	return begun, nil
}

// tookEndedSlot reports whether a delivery whose attempt's start failed with err took the slot
// held in job's row from it (jobs.Store.TakeEndedSlot), the job having ended meanwhile
// (ErrNotRunnable): then it gives the slot back, and a later delivery of the ended job does not.
// The take's own error means the slot is still in the row: the delivery is to come back for it.
func (e *Executor) tookEndedSlot(ctx context.Context, job *jobs.Job, err error) (bool, error) {
	if !errors.Is(err, jobs.ErrNotRunnable) || job.SlotSeq == nil {
		return false, nil
	}
	tctx, cancel := e.storeCtx(context.WithoutCancel(ctx))
	defer cancel()
	return e.cfg.Store.TakeEndedSlot(tctx, job.ID, *job.SlotSeq)
}

// errLeaseLost: a renewal of the attempt's lease found the job moved on without it (canceled, or
// taken over by another delivery); the call is stopped.
var errLeaseLost = errors.New("the job moved on without this attempt (canceled, or its lease taken over)")

// attempt calls the provider once and records what came of it.
func (e *Executor) attempt(ctx context.Context, job *jobs.Job, up Upstream, adm admission) error {
	// The lease is kept until the outcome is recorded, not only through the call: recording may
	// wait for Postgres (see record), and the job must not be taken over meanwhile. A renewal
	// that finds the job moved on stops the call: a cancel whose abort never reached this
	// process (asynq's signal goes through Redis) ends it within a renewal, a long stream too.
	callCtx, abort := context.WithCancelCause(ctx)
	defer abort(nil)
	lease := e.keepLease(ctx, job, abort)
	defer lease.stop()
	e.reportSend(ctx, up, adm)
	r := e.call(callCtx, job, up, adm)
	// The answer's bytes count against the worker's answer budget until its outcome is stored.
	defer r.resp.Release()
	if r.err != nil && errors.Is(context.Cause(callCtx), errLeaseLost) {
		// The attempt is recorded (it was sent); the job is not moved: it ended, or another
		// delivery holds it (a status that is not final is refused under another's lease).
		_, err := e.record(context.WithoutCancel(ctx), job.ID, r.attempt,
			jobs.Outcome{Status: jobs.StatusRetrying, LastError: lastErrorOf(r.err, r.decision)})
		if err != nil {
			return err
		}
		return errHandled
	}
	if r.err == nil {
		// What the answer taught the limiter and the breaker goes to Redis while the result goes
		// to Postgres: the result is not held back by the bookkeeping, and the delivery ends
		// when both are done.
		book := r.book // not r: the goroutine would move it to the heap
		book.done.Add(1)
		go book.runBeside()
		err := e.end(ctx, job, r.attempt, jobs.Outcome{Status: jobs.StatusSucceeded, Result: r.resp.Body,
			Usage: storedUsage(r.resp.Usage), AnsweredBy: up.Name})
		book.done.Wait()
		return err
	}
	return e.decide(ctx, job, up, r)
}

// storedUsage is u as a job's and an attempt's rows store it (llm.Usage's JSON), or nil (NULL)
// when the provider reported no count (llm.Usage.Reported): an answer without a usage is not one
// that cost 0 tokens. The batch lane stores a result's usage by the same rule.
func storedUsage(u llm.Usage) json.RawMessage {
	if !u.Reported() {
		return nil
	}
	b, _ := json.Marshal(u) // a struct of ints and a bool: no error
	return b
}

// callResult is what one provider call came to.
type callResult struct {
	resp     *llm.Response        // nil when err is set
	err      error                // the call's error
	decision retrypolicy.Decision // err classified
	attempt  *jobs.Attempt        // the attempt's record
	at       time.Time            // when the answer or the failure came
	stream   *deltastream.Writer  // a streaming job's deltas (closed); nil otherwise
	// book tells the limiter and the breaker what a successful answer showed (the caller runs
	// it once); nil for a failure, whose bookkeeping was done before call returned, for the
	// retry decision.
	book *bookkeeping
}

// bookkeeping is the after-call bookkeeping of an attempt (afterCall), with what it needs, in
// one allocation: a closure and the stream's headers' answer it shared with the stream's
// callback were 2 at every call (TestCall_Allocs), and the channel attempt waited on
// for it one more at every answer.
type bookkeeping struct {
	e       *Executor
	ctx     context.Context
	up      Upstream
	adm     admission
	job     *jobs.Job
	resp    *llm.Response
	callErr error
	d       retrypolicy.Decision
	started time.Time
	now     time.Time
	// heard is what a stream's headers told when they came (set by the stream's callback).
	heard *heardAtStart
	// done is runBeside's: a channel of its own was one more allocation.
	done sync.WaitGroup
}

// runBeside is run on a goroutine of its own, beside the record of the answer; done is added to
// before it starts.
func (b *bookkeeping) runBeside() {
	defer b.done.Done()
	gostack.Grow()
	b.run()
}

// run does the bookkeeping (once).
func (b *bookkeeping) run() {
	b.e.afterCall(b.ctx, b.up, b.adm, b.job, b.resp, b.callErr, b.d, b.started, b.now, b.heard)
	b.e.timed(StageBookkeeping, b.now)
}

// call sends the job's request through up within the attempt's timeouts and returns what came of
// it; it has told the limiter and the breaker what a failure showed, and returns that work for
// an answer (callResult.book).
func (e *Executor) call(ctx context.Context, job *jobs.Job, up Upstream, adm admission) callResult {
	started := e.cfg.Now()
	attemptTimeout, firstByte := up.AttemptTimeout, up.FirstByteTimeout
	if job.AttemptTimeout != nil {
		attemptTimeout = time.Duration(*job.AttemptTimeout)
	}
	if job.FirstByteTimeout != nil {
		firstByte = time.Duration(*job.FirstByteTimeout)
	}
	callCtx, cancel := context.WithTimeout(ctx, min(attemptTimeout, job.Deadline.Sub(started)))
	opts := llm.SendOptions{FirstByteTimeout: firstByte, StallTimeout: up.StallTimeout}
	stream := e.streamWriter(job)
	book := &bookkeeping{e: e, ctx: ctx, up: up, adm: adm, job: job, started: started}
	if stream != nil {
		opts.OnDelta = func(d llm.Delta) { stream.Add(deltastream.Delta(d)) }
		if up.Gate != nil && adm.awaited() {
			// book.up, not up: a closure holds a variable over 128 bytes by reference, which puts up on
			// the heap for every call, streamed or not.
			opts.OnStream = func(s llm.StreamStart) { book.heard = e.observeStreamStart(ctx, book.up, adm, s, started, job) }
		}
	}
	resp, callErr := up.Provider.Send(callCtx, job.Request, opts)
	cancel()
	if stream != nil {
		// Every delta is in Redis before the outcome is recorded: a client sees the whole
		// stream before the terminal (or retrying) event.
		wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		stream.Close(wctx)
		cancel()
	}
	now := e.cfg.Now()
	e.cfg.Metrics.stage(StageCall, now.Sub(started))
	a := &jobs.Attempt{Number: job.Attempts, Credential: up.Name, StartedAt: started, Latency: now.Sub(started)}
	if job.LeaseToken != nil {
		a.LeaseToken = *job.LeaseToken
	}
	d := retrypolicy.Classify(callErr, now)
	if d.MalformedRetryAfter {
		// The provider asked for a retry without a usable hint: say so once, with what it sent
		// (a value cut to 64 bytes, the key already redacted from it by internal/llm).
		e.cfg.Logger.WarnContext(ctx, "unusable Retry-After from the provider: a retry without a hint (backoff), not a spend cap",
			"credential", up.Name, "job_id", job.ID, "status", d.StatusCode, "class", d.Class, "retry_after", d.RetryAfterValue)
	}
	book.resp, book.callErr, book.d, book.now = resp, callErr, d, now
	if callErr != nil {
		book.run()
	}
	if callErr == nil {
		a.StatusCode, a.TTFB, a.Class = resp.StatusCode, resp.TimeToFirstByte, string(retrypolicy.ClassOK)
	} else {
		a.Class, a.StatusCode, a.Error = string(d.Class), d.StatusCode, callErr.Error()
		if se, ok := errors.AsType[*llm.StatusError](callErr); ok {
			a.TTFB = se.TimeToFirstByte
		} else if te, ok := errors.AsType[*llm.TransportError](callErr); ok {
			// A body cut after its headers came: the provider had answered (StatusCode), and
			// had begun to (TTFB) if a stream's first delta, or a body's first byte, came. The
			// cut stays the class.
			a.TTFB, a.StatusCode = te.TimeToFirstByte, te.StatusCode
		}
		if d.HasRetryAfter {
			ra := d.RetryAfter
			a.RetryAfter = &ra
		}
		if u, ok := llm.FailedUsage(callErr); ok {
			// What the attempt cost, on its row only: the job's usage is its answer's.
			a.Usage = storedUsage(u)
		}
	}
	e.cfg.Metrics.attempt(up.Name, a.Class, a.Latency)
	r := callResult{resp: resp, err: callErr, decision: d, attempt: a, at: now, stream: stream}
	if callErr == nil {
		r.book = book
	}
	return r
}

// streamWriter returns the delta writer of a streaming job's attempt, or nil.
func (e *Executor) streamWriter(job *jobs.Job) *deltastream.Writer {
	if e.cfg.Deltas == nil || !deltastream.Requested(job.Request) {
		return nil
	}
	return e.cfg.Deltas.Writer(job.ID, job.EventSeq, job.Attempts)
}

// resetStream tells the job's event streams that the attempt's deltas are void: a retry starts
// over. It runs before the retry is recorded, so the reset precedes the next status event.
func resetStream(ctx context.Context, r callResult) {
	if r.stream != nil {
		wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		r.stream.Reset(wctx)
	}
}

// decide records a failed attempt's consequence: the job is given back on shutdown, fails (its
// deadline passed during the call), fails over (a retryable failure, a spend cap, or the
// provider's refusal of the request as too large before the job's deadline, with a fallback and
// an attempt left), dies (a spend cap, or its attempts used up), fails (not worth retrying, or
// the deadline comes before the next attempt), or is retried after the policy's delay.
func (e *Executor) decide(ctx context.Context, job *jobs.Job, up Upstream, r callResult) error {
	a, d, now := r.attempt, r.decision, r.at
	lastErr := lastErrorOf(r.err, d)
	switch {
	case d.Class == retrypolicy.ClassCanceled:
		// Our own context ended (shutdown): give the job back untouched for the next delivery.
		if ctx.Err() != nil {
			// Shutdown, or a cancel that already ended the job (then nothing is recorded, and
			// nothing reset: the job is over, not retried). A reset after the retrying event is
			// still ordered before it by the event streams (see internal/api).
			applied, err := e.record(context.WithoutCancel(ctx), job.ID, a, jobs.Outcome{Status: jobs.StatusRetrying, LastError: lastErr})
			if err != nil {
				return err
			}
			if applied {
				resetStream(ctx, r)
			}
			return ctx.Err()
		}
		return e.end(ctx, job, a, jobs.Outcome{Status: jobs.StatusFailed, LastError: lastErr})
	case d.Retry && !now.Before(job.Deadline):
		// The job's deadline ended the call (its context ends there) or came with its failure:
		// no attempt may follow, here or on a fallback. The job fails as the client's timeout
		// says, not dead as out of attempts (an operator's alert for a client's timeout).
		lastErr.Message = fmt.Sprintf("job deadline passed during the attempt (%s)", lastErr.Message)
		lastErr.Class = jobs.ReasonDeadlineExceeded
		return e.end(ctx, job, a, jobs.Outcome{Status: jobs.StatusFailed, LastError: lastErr})
	case (d.Retry || d.DeadReason != "" || (d.TooLarge && now.Before(job.Deadline))) && job.HasNextCredential() &&
		job.Attempts < job.MaxAttempts:
		// Fail over at once: the fallback is a different key, so neither a backoff for this
		// provider's trouble nor its spend cap applies to it, and its model or limits may take
		// a request this one refused as too large. A size refusal counts as an attempt (it was
		// sent and is recorded), so it moves only with an attempt left, as any failover after a
		// call, and only before the job's deadline (after it, it fails as any permanent error:
		// no retrying event after the client's timeout); see docs/decisions.md, "A provider's
		// refusal for size fails over".
		if d.DeadReason != "" {
			if err := e.pause(ctx, up, job, d.DeadReason, lastErr.Message); err != nil {
				return err
			}
		}
		resetStream(ctx, r)
		if _, err := e.record(context.WithoutCancel(ctx), job.ID, a, jobs.Outcome{Status: jobs.StatusRetrying, LastError: lastErr, NextCredential: true}); err != nil {
			return err
		}
		return &deferral{until: now, reason: "fail over after " + failoverCause(d), stored: true}
	case d.DeadReason != "":
		// Pause first: an operator who sees the dead letter finds the credential paused, and a
		// resume that follows the dead letter is never overtaken by its pause. A pause Redis
		// refused is logged, not returned: the answer was paid for and is recorded now (the next
		// spend-cap answer on the credential pauses it again).
		if err := e.pause(ctx, up, job, d.DeadReason, lastErr.Message); err != nil {
			e.cfg.Logger.ErrorContext(ctx, "pause credential after a spend cap", "credential", up.Name, "job_id", job.ID, "error", err)
		}
		return e.end(ctx, job, a, jobs.Outcome{Status: jobs.StatusDead, DeadReason: d.DeadReason, LastError: lastErr})
	case !d.Retry:
		return e.end(ctx, job, a, jobs.Outcome{Status: jobs.StatusFailed, LastError: lastErr})
	case job.Attempts >= job.MaxAttempts:
		if err := e.end(ctx, job, a, jobs.Outcome{Status: jobs.StatusDead, DeadReason: jobs.ReasonRetriesExhausted, LastError: lastErr}); !errors.Is(err, errHandled) {
			return err
		}
		e.cfg.Alerter.Throttled(ctx, alert.Alert{Credential: up.Name, Reason: jobs.ReasonRetriesExhausted, JobID: job.ID,
			Message: fmt.Sprintf("job used all %d attempts; last error: %s", job.MaxAttempts, lastErr.Message)}, time.Minute)
		return errHandled
	}
	delay := e.cfg.Policy.Delay(job.Attempts, d)
	next := now.Add(delay)
	if !next.Before(job.Deadline) {
		lastErr.Message = fmt.Sprintf("deadline passes before the next attempt could start (%s)", lastErr.Message)
		lastErr.Class = jobs.ReasonDeadlineExceeded
		return e.end(ctx, job, a, jobs.Outcome{Status: jobs.StatusFailed, LastError: lastErr})
	}
	a.Delay = &delay
	resetStream(ctx, r)
	if _, err := e.record(context.WithoutCancel(ctx), job.ID, a, jobs.Outcome{Status: jobs.StatusRetrying, LastError: lastErr, NextAttemptAt: &next}); err != nil {
		return err
	}
	return &deferral{until: next, reason: "retry after " + string(d.Class), stored: true}
}

// failoverCause names, for a failover's deferral, what the call that failed over came to: its
// class, or the provider's refusal of the request as too large.
func failoverCause(d retrypolicy.Decision) string {
	if d.TooLarge {
		return "the provider refused the request as too large"
	}
	return string(d.Class)
}

// lastErrorOf is the job's last_error for a failed call.
func lastErrorOf(err error, d retrypolicy.Decision) *jobs.LastError {
	le := &jobs.LastError{Class: string(d.Class), Status: d.StatusCode, Message: err.Error()}
	if se, ok := errors.AsType[*llm.StatusError](err); ok {
		le.Message = se.Message
		le.Type = se.ErrorType()
	}
	if d.HasRetryAfter {
		ms := d.RetryAfter.Milliseconds()
		le.RetryAfterMS = &ms
	}
	return le
}
