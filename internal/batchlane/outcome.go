package batchlane

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/llmq/llmq/internal/jobs"
	"github.com/llmq/llmq/internal/llm"
	"github.com/llmq/llmq/internal/retrypolicy"
)

// record applies an ended batch's results to its jobs by custom_id. Outcomes map onto the
// online lane's classes:
//   - succeeded: the job succeeds with the provider's answer (cost class batch);
//   - errored with a spend-cap code (billing_error, insufficient_quota...), or the batch failed
//     as a whole with one (its round counts no attempt): the job is dead
//     (rate_limited_no_retry_after) and the credential paused first, as online (a pause
//     Redis refused leaves such jobs in the batch, for the next poll to pause again);
//   - errored with a request error (400, 401, 403, 404, 413, 422...): the job fails, as online;
//   - errored with a server or overload error (408, 409, 429, 5xx, 529), expired, canceled, or
//     no result for the job (missing: noLine, or the batch's failure): the job is retried
//     within its attempts (see retryMove); a round its request did not run in for the
//     provider's capacity (429, 503, 529, expired, or the batch's failure) gives its attempt
//     back (all but a failed batch's only while the job has fewer than max_attempts attempt
//     rows of such refusals: store.refusals).
//
// A job with several lines keeps its answer, if one is among them, else its last line.
//
// A job that ended or left the batch meanwhile (canceled, moved online) is left alone: its
// result is discarded; a canceled one's answer keeps its usage only (keepLateUsage), since the
// provider charged for it.
func (b *Batcher) record(ctx context.Context, lane Lane, row batchRow, jobs []batchJob, results []Result, missing Result,
	providerState string, held heldLanes) error {
	now := b.cfg.Now()
	byID := make(map[string]Result, len(results))
	for _, r := range results {
		// A custom_id's lines after its answer (a results file that repeats one, OpenAI's
		// output and error files both naming it) do not undo it: the answer is paid for.
		if prev, ok := byID[r.CustomID]; !ok || prev.Kind != Succeeded {
			byID[r.CustomID] = r
		}
	}
	var refused []string // jobs a result refused for the provider's capacity
	for _, j := range jobs {
		r, ok := byID[j.ID]
		if ok && j.unfinished() && (r.Kind == Expired || r.Kind == Errored && capacityStatus(r.Status)) {
			refused = append(refused, j.ID)
		}
	}
	counts, err := b.store.refusals(ctx, refused)
	if err != nil {
		return err
	}
	var moves []move
	var capped *Result // the first result that was a spend cap
	var errs []error
	for _, j := range jobs {
		j.Refused = counts[j.ID]
		if !j.unfinished() {
			if r, ok := byID[j.ID]; ok && r.Kind == Succeeded && j.Status == "canceled" {
				errs = append(errs, b.store.keepLateUsage(ctx, j.ID, row.ID, usageOf(r.Body)))
			}
			continue
		}
		r, ok := byID[j.ID]
		if !ok {
			r = missing
			r.CustomID = j.ID
		}
		m := b.decide(lane, row, j, r, now, providerState)
		moves = append(moves, m)
		if m.DeadReason == retrypolicy.DeadReasonRateLimitedNoRetryAfter && capped == nil {
			capped = &r
		}
	}
	// The spend cap pauses the credential before its jobs are dead-lettered, as online: an
	// operator who sees a dead letter finds the credential paused. A pause Redis refused leaves
	// them in the batch, whose next poll reads its results again and pauses again.
	paused := true
	if capped != nil {
		what := "a request of batch " + row.ID
		cause := fmt.Errorf("request %s answered %d %s: %s", capped.CustomID, capped.Status, capped.ErrorType, capped.Message)
		if capped.Kind == Failed {
			what = "batch " + row.ID
			cause = fmt.Errorf("the batch failed: %s: %s", capped.ErrorType, capped.Message)
		}
		if err := b.spendCap(ctx, lane, held, what, retrypolicy.DeadReasonRateLimitedNoRetryAfter, cause); err != nil {
			errs, paused = append(errs, fmt.Errorf("%w: %w", errPauseRefused, err)), false
		}
	}
	for _, m := range moves {
		if !paused && m.DeadReason == retrypolicy.DeadReasonRateLimitedNoRetryAfter {
			continue
		}
		errs = append(errs, b.applyMove(ctx, row.Credential, m))
	}
	return errors.Join(errs...)
}

// errPauseRefused: record could not pause the credential for a spend cap (Redis refused it), so
// the spend-capped jobs stay in their batch; the batch's next poll comes after the poll backoff
// (afterRecord), as after a failed poll, not at the next pass: each poll reads the batch, and
// its results, again from the provider.
var errPauseRefused = errors.New("the spend cap's pause was refused: its jobs wait in their batch for a later poll")

// afterRecord is what a poll returns after record's error err: one of a refused pause is tried
// again after the backoff (later), any other (Postgres's) at the next pass, as before.
func afterRecord(err error, later func(error) error) error {
	if errors.Is(err, errPauseRefused) {
		return later(err)
	}
	return err
}

// noLine is the result of a job that the batch's results hold no line for.
var noLine = Result{Kind: Expired, Message: "the batch's results hold no line for the job",
	missing: true}

// expiredMessage is the error of an expired request's attempt row, which store.refusals counts
// among the rounds the provider refused (see decide).
const expiredMessage = "the job's batch request expired: " +
	"the provider did not run it within the batch's window"

// failedSpendCapMessage begins the error of a job whose batch failed as a whole with a
// spend-cap code: the provider refused the batch, none of its requests ran.
const failedSpendCapMessage = "the job's batch was refused by the provider with a spend-cap code: "

// typedError is a result's error type as retrypolicy.Classify reads one: its spend-cap codes.
type typedError string

func (e typedError) Error() string     { return string(e) }
func (e typedError) ErrorType() string { return string(e) }

// spendCapCode reports whether a result's error type is a spend-cap code (insufficient_quota,
// billing_error, ...), read as the online lane reads an answer's (retrypolicy.Classify). A
// result's status alone is not: a 429 in a results file has no header to tell a spend cap from
// a rate limit.
func spendCapCode(errorType string) bool {
	return errorType != "" && retrypolicy.Classify(typedError(errorType), time.Time{}).Class == retrypolicy.ClassSpendCap
}

// decide maps one result onto the job's move.
func (b *Batcher) decide(lane Lane, row batchRow, j batchJob, r Result, now time.Time, providerState string) move {
	switch {
	case r.Kind == Succeeded:
		m := b.attempt(row, j, now, http.StatusOK, "ok", "")
		m.Status, m.Lane, m.Result, m.Usage, m.BatchState = "succeeded", "batch", r.Body, usageOf(r.Body), providerState
		return m
	case (r.Kind == Errored || r.Kind == Failed) && spendCapCode(r.ErrorType):
		// As the online lane: dead, for an operator to retry once the account pays again (see
		// record, which pauses the credential). A batch that failed as a whole for it ran
		// none of its requests: the round counts no attempt.
		msg := r.Message
		if r.Kind == Failed {
			msg = failedSpendCapMessage + r.Message
		}
		m := b.attempt(row, j, now, r.Status, string(retrypolicy.ClassSpendCap), msg)
		m.Status, m.Lane, m.BatchState = "dead", "online", providerState
		m.DeadReason = retrypolicy.DeadReasonRateLimitedNoRetryAfter
		m.LastError = map[string]any{"class": string(retrypolicy.ClassSpendCap), "type": r.ErrorType,
			"message": msg}
		if r.Status != 0 {
			m.LastError["status"] = r.Status
		}
		m.GiveBack = r.Kind == Failed
		return m
	case r.Kind == Errored && !retryableStatus(r.Status):
		m := b.attempt(row, j, now, r.Status, "permanent", r.Message)
		m.Status, m.Lane, m.BatchState = "failed", "batch", providerState
		m.LastError = map[string]any{"class": "permanent", "status": r.Status, "type": r.ErrorType, "message": r.Message}
		return m
	case r.Kind == Errored:
		// At most max_attempts such rounds are given back: a provider that ends each batch
		// within minutes, refusing it, would send the job round until its deadline.
		giveBack := capacityStatus(r.Status) && j.Refused < j.MaxAttempts
		m := b.retryMove(row, j, now, r.ErrorType, r.Message, giveBack)
		m.AttemptStatus = r.Status
		m.LastError["status"] = r.Status
		if lane.Config.Window <= j.Deadline.Sub(now) && m.Status == "retrying" {
			m.Lane, m.BatchState = "batch", "waiting" // room for another batch: stay at half price
		}
		return m
	case r.Kind == Expired && !r.missing:
		// The batch's window passed before the provider ran the request: no call of the job's
		// was made, as in a round refused for the provider's capacity, and under the same
		// bound (its attempt row, of expiredMessage, counts in store.refusals).
		// It goes online, as before: the batch lane could not make it within a window.
		return b.retryMove(row, j, now, "batch_expired", expiredMessage, j.Refused < j.MaxAttempts)
	case r.Kind == Failed:
		// None of the batch's requests ran (a batch quota such as OpenAI's enqueued token
		// limit): no call of the job's was made, so the round counts none.
		return b.retryMove(row, j, now, cmp.Or(r.ErrorType, "batch_failed"),
			"the job's batch failed: "+r.Message, true)
	}
	return b.retryMove(row, j, now, "batch_"+string(r.Kind),
		"the job's batch request "+string(r.Kind)+": "+r.Message, false)
}

// retryMove sends job j round again, online: retrying within its attempts (dead with
// retries_exhausted once they are spent), its last error of class retryable naming why. A dead
// job is left in the online lane, so that an operator's retry (ctl dead retry) runs it there.
// giveBack gives the round's attempt back (move.GiveBack): its request did not run for the
// provider's capacity, so it spends none of the job's attempts and the job is never dead.
func (b *Batcher) retryMove(row batchRow, j batchJob, now time.Time, typ, msg string,
	giveBack bool) move {
	m := b.attempt(row, j, now, 0, "retryable", msg)
	m.LastError = map[string]any{"class": "retryable", "type": typ, "message": msg}
	m.Status, m.Lane, m.BatchState = "retrying", "online", typ
	m.GiveBack = giveBack
	if !giveBack && j.Attempts >= j.MaxAttempts {
		m.Status, m.DeadReason = "dead", "retries_exhausted"
	}
	return m
}

// deadlineMove sends job j, whose batch had not ended when its deadline came near, online
// (retryMove). One with no attempt left fails deadline_exceeded: its deadline cut its batch, as
// a call's deadline cuts an online attempt; it is not dead retries_exhausted (an operator's
// alert, and a `ctl dead retry` candidate, for a client's timeout).
func (b *Batcher) deadlineMove(row batchRow, j batchJob, now time.Time) move {
	const msg = "the batch had not ended when the job's deadline came near"
	m := b.retryMove(row, j, now, "deadline_fallback", msg, false)
	if m.Status == "dead" {
		m.Status, m.Lane, m.DeadReason = "failed", "batch", ""
		m.LastError = map[string]any{"class": jobs.ReasonDeadlineExceeded, "type": "deadline_fallback",
			"message": msg + ", and it had no attempt left to go online"}
	}
	return m
}

// attempt is the move's attempt record: the batch request, from the batch's send until now.
func (b *Batcher) attempt(row batchRow, j batchJob, now time.Time, status int, class, msg string) move {
	ref := row.ID
	m := move{JobID: j.ID, Ref: &ref, AttemptStatus: status, AttemptClass: class, AttemptError: msg, AttemptStarted: now}
	if row.SubmittedAt != nil {
		m.AttemptStarted, m.AttemptLatency = *row.SubmittedAt, now.Sub(*row.SubmittedAt)
	}
	return m
}

// capacityStatus reports whether a request's error status is the provider's capacity, not the
// request's nor a fault: 429 (a results file has no Retry-After to tell it from a spend cap, which
// a spend-cap code says: spendCapCode), 503 and 529 (overloaded). Online such a call counts an
// attempt, but the limiter paces the next by the answer; in a batch nothing paces a request, and
// a round is hours long, so a job could spend its attempts on other jobs' load (see
// docs/decisions.md, "A batch round refused for the provider's capacity gives its attempt back").
func capacityStatus(status int) bool {
	switch status {
	case http.StatusTooManyRequests, http.StatusServiceUnavailable, 529:
		return true
	}
	return false
}

// retryableStatus is the online lane's rule (internal/retrypolicy): 408, 409, 429, 5xx and 529
// are the provider's side; anything else is the request's.
func retryableStatus(status int) bool {
	switch status {
	case http.StatusRequestTimeout, http.StatusConflict, http.StatusTooManyRequests, 529:
		return true
	}
	return status >= 500
}

// usageOf is the answer's token usage in the online lane's form (llm.Usage: "input_tokens",
// "output_tokens", Anthropic's cache counts when not zero, and "output_unreported" when it has
// no output count while it has another), from an Anthropic or OpenAI body; nil when it has no
// usage object or one that counts nothing (llm.Usage.Reported), as the online lane stores none
// for those. A missing input count is 0, as the online lane decodes it (llm's dialects).
func usageOf(body json.RawMessage) json.RawMessage {
	var a struct {
		Usage *struct {
			InputTokens              *int `json:"input_tokens"`
			OutputTokens             *int `json:"output_tokens"`
			PromptTokens             *int `json:"prompt_tokens"`
			CompletionTokens         *int `json:"completion_tokens"`
			CacheCreationInputTokens int  `json:"cache_creation_input_tokens"`
			CacheReadInputTokens     int  `json:"cache_read_input_tokens"`
		} `json:"usage"`
	}
	if json.Unmarshal(body, &a) != nil || a.Usage == nil {
		return nil
	}
	u := a.Usage
	in, out := u.InputTokens, u.OutputTokens
	if in == nil && out == nil {
		in, out = u.PromptTokens, u.CompletionTokens
	}
	usage := llm.Usage{CacheCreationInputTokens: u.CacheCreationInputTokens, CacheReadInputTokens: u.CacheReadInputTokens}
	if in != nil {
		usage.InputTokens = *in
	}
	if out != nil {
		usage.OutputTokens = *out
	} else {
		usage.OutputUnreported = usage != (llm.Usage{})
	}
	if !usage.Reported() {
		return nil
	}
	b, _ := json.Marshal(usage)
	return b
}
