package jobs

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/llmq/llmq/internal/retrypolicy"
)

// AttemptLease is how long BeginAttempt's lease holds a job without RenewLease: the time after
// which a delivery that died mid-attempt no longer blocks the next one.
const AttemptLease = 15 * time.Second

// LeasedError is BeginAttempt's answer when another delivery's attempt holds the job.
type LeasedError struct {
	// Until is when the holder's lease ends unless renewed (Postgres's clock).
	Until time.Time
}

func (e *LeasedError) Error() string {
	return "another delivery's attempt holds the job until " + e.Until.UTC().Format(time.RFC3339Nano)
}

// BeginAttempt marks the job running, counts the attempt and takes the attempt's lease for
// AttemptLease (Job.LeaseToken; keep it with RenewLease while the call runs, Finish the attempt
// with it). The job it returns has no Request: a request never changes, use Get's. It returns
// ErrNotRunnable for a terminal (or missing) job and a *LeasedError while another delivery's
// lease holds the job: a running job is taken over only once its lease has ended (its delivery
// died), so one job never has two calls in flight. When the store runs its statement again
// because the first run's commit answer was lost, it answers with the lease that first run took,
// and the attempt is counted once.
func (s *Store) BeginAttempt(ctx context.Context, id string) (*Job, error) {
	// The lease token is this call's own, so that a run of this statement again (the batcher
	// reruns a batch whose commit answer was lost) knows the lease it finds for its own.
	token := uuid.NewString()
	// One statement (atomic; batched with other callers', see batcher): the update and its
	// event; a trigger notifies.
	job, err := s.queryJob(ctx, id, `
WITH u AS (
	UPDATE jobs SET status = 'running', attempts = attempts + 1, started_at = coalesce(started_at, now()),
		next_attempt_at = NULL, slot_seq = NULL, slot_grant = NULL, updated_at = now(), event_seq = event_seq + 1,
		lease_token = $3::uuid, lease_until = clock_timestamp() + $2 * interval '1 millisecond'
	WHERE id = $1 AND status IN ('queued', 'running', 'retrying')
		AND (status <> 'running' OR lease_until IS NULL OR lease_until <= clock_timestamp())
	RETURNING *
), e AS (
	INSERT INTO job_events (job_id, seq, type, payload)
	SELECT id, event_seq, 'running', jsonb_build_object('attempt', attempts) FROM u
)
SELECT `+jobColumnsNoRequest+` FROM u`, id, attemptLeaseMS, token)
	if err == nil {
		return job, nil
	}
	if !errors.Is(err, ErrNotFound) {
		return nil, fmt.Errorf("begin attempt: %w", err)
	}
	// Not runnable: say whether a live lease is why (or the job is terminal or missing). The
	// lease may be this call's own: its first run committed, and its answer was lost.
	job, err = s.scanJob(s.pool.QueryRow(ctx, `SELECT `+jobColumnsNoRequest+` FROM jobs
WHERE id = $1 AND status = 'running' AND lease_until > clock_timestamp()`, id))
	switch {
	case err == nil && job.LeaseToken != nil && *job.LeaseToken == token:
		return job, nil
	case err == nil && job.LeaseUntil != nil:
		return nil, &LeasedError{Until: *job.LeaseUntil}
	case err == nil || errors.Is(err, ErrNotFound):
		return nil, ErrNotRunnable
	}
	return nil, fmt.Errorf("begin attempt: %w", err)
}

// RenewLease extends the lease token holds on job id to AttemptLease from now. It reports false
// when the lease is no longer token's (the job finished, or another delivery took it over).
func (s *Store) RenewLease(ctx context.Context, id, token string) (bool, error) {
	tag, err := s.pool.Exec(ctx, `UPDATE jobs SET lease_until = clock_timestamp() + $3 * interval '1 millisecond'
WHERE id = $1 AND lease_token = $2::uuid AND status = 'running'`, id, token, attemptLeaseMS)
	if err != nil {
		return false, fmt.Errorf("renew attempt lease: %w", err)
	}
	return tag.RowsAffected() == 1, nil
}

// waitingForAttempt is the SQL condition of a job that waits for its next attempt: queued,
// retrying, or running with no live lease (the delivery of its last attempt died before
// recording the outcome). Without the last case, a crashed job's held slot was not recorded, so
// each delivery reserved a new slot further out and the job never reached its turn.
const waitingForAttempt = `(status IN ('queued', 'retrying') OR
	(status = 'running' AND (lease_until IS NULL OR lease_until <= clock_timestamp())))`

// HoldSlot records that the job holds a limiter slot to send at sendAt (sequence seq), so the
// delivery that comes back for it sends then without reserving again. sendAt is on the limiter's
// clock (limiter.Reservation.SendAt, Redis's), and so is the job's NextAttemptAt while it holds
// the slot: the delivery waits for it on that clock (limiter.Gate.NowAndPaused), not on its host's. It is
// not a transition (no event) and applies only to a job waiting for an attempt (see
// waitingForAttempt): held reports whether the row took the slot. One that did not (the job
// ended, canceled say, or another delivery's attempt holds it) holds nothing for the slot, which
// its caller gives back.
func (s *Store) HoldSlot(ctx context.Context, id string, sendAt time.Time, seq, grant int64) (held bool, err error) {
	tag, err := s.pool.Exec(ctx, `UPDATE jobs SET next_attempt_at = $2, slot_seq = $3, slot_grant = $4, updated_at = now()
WHERE id = $1 AND `+waitingForAttempt, id, sendAt, seq, grant)
	if err != nil {
		return false, fmt.Errorf("hold limiter slot: %w", err)
	}
	return tag.RowsAffected() == 1, nil
}

// TakeEndedSlot clears the limiter slot (sequence seq) that job id still holds in its row after it
// ended (canceled, or failed by its deadline, while it waited for the slot: those transitions
// leave the slot where it is), and reports whether this call cleared it. Only the caller that
// gets true gives the slot back, so a slot is given back once however many deliveries find the
// job ended; a slot already sent is never in the row (BeginAttempt clears it), and neither is one
// a job moved off (NextCredential).
func (s *Store) TakeEndedSlot(ctx context.Context, id string, seq int64) (bool, error) {
	tag, err := s.pool.Exec(ctx, `UPDATE jobs SET slot_seq = NULL, slot_grant = NULL
WHERE id = $1 AND slot_seq = $2 AND status IN ('succeeded', 'failed', 'dead', 'canceled')`, id, seq)
	if err != nil {
		return false, fmt.Errorf("take an ended job's limiter slot: %w", err)
	}
	return tag.RowsAffected() == 1, nil
}

// Postpone sets the time before which the job's next delivery must not send (a breaker
// cooldown, a pause, a spent retry budget). A held limiter slot is kept: sending later than a
// slot is always safe. until is on the caller's clock, and a row holding a slot is read on the
// limiter's: the executor postpones a held slot only once it is due, so a host's skew moves the
// recheck, never the slot (docs/operations.md, Clocks). It is not a transition (no event) and
// applies only to a job waiting for an attempt (see waitingForAttempt) at the credential index
// from (Job.CredentialIndex as the caller read it): a job another delivery moved to a fallback
// meanwhile (NextCredential) is that delivery's, due there at once, and is left as it is.
func (s *Store) Postpone(ctx context.Context, id string, from int, until time.Time) error {
	_, err := s.pool.Exec(ctx, `UPDATE jobs SET next_attempt_at = $2, updated_at = now()
WHERE id = $1 AND `+waitingForAttempt+` AND credential_index = $3`, id, until, from)
	if err != nil {
		return fmt.Errorf("postpone job: %w", err)
	}
	return nil
}

// WaitForCredential is Postpone for a job whose credential cannot take it now (paused, its
// breaker open, not in the delivering process's config): reason says which. A job whose
// attempt's delivery died (running, its lease ended) moves to retrying, with a retrying event,
// its lease given back and a last_error of class canceled (retrypolicy.ClassCanceled: its worker
// stopped mid-call, as a worker that stops on a signal records it) naming the attempt and reason; its
// dead attempt stays counted, unrecorded, as when the next attempt takes the job over. Left
// running, it showed a call in flight, and counted as no waiting job, for as long as the
// credential stayed unable. A queued or retrying job is postponed as Postpone does; a job whose
// attempt holds a live lease, or that ended, or that is no longer at the credential index from
// (another delivery failed it over meanwhile), is left as it is.
func (s *Store) WaitForCredential(ctx context.Context, id string, from int, until time.Time, reason string) error {
	_, err := s.pool.Exec(ctx, waitForCredentialSQL, id, until, reason, from)
	if err != nil {
		return fmt.Errorf("postpone job for its credential: %w", err)
	}
	return nil
}

// waitForCredentialSQL is WaitForCredential's statement: the move of a job whose attempt was
// lost, with its event (a trigger notifies), or the postponement of a job already waiting. The
// two updates' conditions exclude each other on the statement's snapshot, so at most one
// applies; a transition committed while it waited for the row's lock (a Finish, a takeover)
// makes both miss, and that row's state stands. Both apply only at the credential index $4.
const waitForCredentialSQL = `
WITH lost AS (
	UPDATE jobs SET status = 'retrying', next_attempt_at = $2, lease_token = NULL, lease_until = NULL,
		last_error = jsonb_build_object('class', '` + string(retrypolicy.ClassCanceled) + `', 'message', 'attempt ' || attempts ||
			' ended without an outcome (its delivery stopped, a worker crash say); waiting: ' || $3::text),
		updated_at = now(), event_seq = event_seq + 1
	WHERE id = $1 AND status = 'running' AND (lease_until IS NULL OR lease_until <= clock_timestamp())
		AND credential_index = $4
	RETURNING id, event_seq
), e AS (
	INSERT INTO job_events (job_id, seq, type, payload) SELECT id, event_seq, 'retrying', '{}'::jsonb FROM lost
)
UPDATE jobs SET next_attempt_at = $2, updated_at = now()
WHERE id = $1 AND status IN ('queued', 'retrying') AND credential_index = $4`

// NextCredential moves a job waiting for an attempt (see waitingForAttempt) from the credential
// at index from (Job.CredentialIndex as the caller read it) to the next fallback, without an
// attempt (the current one is refused by its breaker or paused). It reports whether it moved: a
// job no longer at from (another delivery of it moved it first, or a dead letter's retry started
// it over) is not moved, so two deliveries that find one credential unavailable move the job
// one fallback on, not two.
func (s *Store) NextCredential(ctx context.Context, id string, from int) (bool, error) {
	tag, err := s.pool.Exec(ctx, `UPDATE jobs SET credential_index = credential_index + 1, slot_seq = NULL, slot_grant = NULL,
	next_attempt_at = NULL, updated_at = now()
WHERE id = $1 AND `+waitingForAttempt+` AND credential_index = $2 AND credential_index < cardinality(fallbacks)`, id, from)
	if err != nil {
		return false, fmt.Errorf("move to fallback credential: %w", err)
	}
	return tag.RowsAffected() == 1, nil
}

// Attempt is the record of one provider call.
type Attempt struct {
	Number     int
	Credential string
	StartedAt  time.Time
	Latency    time.Duration
	// TTFB is the time from sending to the answer's first body byte; a stream's, to its first
	// delta (to its end when none came). A body cut keeps it when it had begun: a stream's after
	// its first delta, a body not streamed after its first byte. 0 when none is known: no body
	// byte arrived, or a stream was cut before its first delta (its opening events perhaps come).
	TTFB time.Duration
	// StatusCode is the provider's HTTP status, a cut answer's included (the status its headers
	// gave). 0: no HTTP answer.
	StatusCode int
	Class      string
	RetryAfter *time.Duration
	Delay      *time.Duration // the wait chosen before the next attempt
	Error      string
	// Usage is what the provider reported for a call that failed partway (a stream cut, or
	// ended by an error event, after it told its usage): kept on the attempt's row only, never
	// the job's usage (the job's is its answer's). Nil: the attempt's row takes Outcome.Usage.
	Usage json.RawMessage
	// LeaseToken is the lease BeginAttempt took for this attempt; Finish releases it (and only
	// it: a lease another delivery took over after this one's ended stays).
	LeaseToken string
}

// Outcome is what an attempt led to.
type Outcome struct {
	Status        Status // succeeded, retrying, failed, dead or queued (deferred without a call)
	Result        json.RawMessage
	Usage         json.RawMessage
	LastError     *LastError
	DeadReason    string
	NextAttemptAt *time.Time
	// AnsweredBy is the credential that produced Result.
	AnsweredBy string
	// NextCredential moves the job to its next fallback credential.
	NextCredential bool
}

// finishSQL is Finish's statement: the attempt (recorded even when the job has ended meanwhile:
// the call was made; numbered after the attempts of earlier rounds, see jobs.attempt_base), the
// conditional move, and its event; a trigger notifies. A run again of an attempt already
// recorded answers the job's event_seq when the job is in $2 (see Finish).
const finishSQL = `
WITH a AS (
	INSERT INTO job_attempts (job_id, attempt, credential, started_at, latency_ms, ttfb_ms, status_code,
		class, retry_after_ms, delay_ms, error, usage)
	SELECT id, $12::integer + attempt_base, $13::text, $14::timestamptz, $15::double precision, $16::double precision,
		$17::integer, $18::text, $19::bigint, $20::bigint, $21::text, coalesce($23::jsonb, $4::jsonb)
	FROM jobs WHERE id = $1 AND $11::boolean
	ON CONFLICT (job_id, attempt) DO NOTHING
	RETURNING 1
), u AS (
	UPDATE jobs SET status = $2, result = coalesce($3, result), usage = $4::jsonb,
		last_error = coalesce($5, last_error), dead_reason = $6, next_attempt_at = $7,
		answered_by = coalesce($8, answered_by),
		credential_index = credential_index + CASE WHEN $9 THEN 1 ELSE 0 END,
		lease_until = CASE WHEN lease_token = $10::uuid THEN NULL ELSE lease_until END,
		lease_token = CASE WHEN lease_token = $10::uuid THEN NULL ELSE lease_token END,
		finished_at = CASE WHEN $2 IN ('succeeded', 'failed', 'dead', 'canceled') THEN now() END,
		updated_at = now(), event_seq = event_seq + 1
	WHERE id = $1 AND status IN ('queued', 'running', 'retrying')
		AND ($2 IN ('succeeded', 'failed', 'dead', 'canceled') OR $10::uuid IS NULL OR lease_token IS NULL
			OR lease_token = $10::uuid OR lease_until <= clock_timestamp())
		AND (NOT $11::boolean OR EXISTS (SELECT 1 FROM a))
	RETURNING id, event_seq
), e AS (
	INSERT INTO job_events (job_id, seq, type, payload) SELECT id, event_seq, $2, $22 FROM u
)
SELECT event_seq FROM u
UNION ALL
SELECT j.event_seq FROM jobs j
WHERE j.id = $1 AND $11::boolean AND NOT EXISTS (SELECT 1 FROM a) AND j.status = $2
	AND EXISTS (SELECT 1 FROM job_attempts x
		WHERE x.job_id = j.id AND x.attempt = $12::integer + j.attempt_base AND x.started_at = $14::timestamptz)`

// Finish records an attempt (when not nil; its lease is released) and moves the job to o.Status
// with its result or error, in one transaction. The move is conditional on the job not being
// terminal already, so a duplicate delivery can never store a second result: applied is false when
// it was terminal. The job's usage becomes o.Usage, its answer's (nil: the answer reported none, or
// there is no answer), never an earlier one's. The attempt keeps a.Usage, or else o.Usage (what the
// provider counted) either way, and a job that ended without a result meanwhile (a cancel) takes
// o.Usage as its usage (keepLateUsage, which announces the attempt not applied to the job's live
// pages, with no event); a.Usage is never the job's. An attempt whose lease another delivery took
// over (and still holds) does not move the job to a status that is not final: the other's call is
// under way, and a job moved back to retrying under it would let a third call start beside it. A
// final outcome still ends the job (an answer paid for is stored; the other's, when it comes, finds
// the job ended).
//
// Finish is safe to run again after its commit's answer was lost (the batcher and record do): an
// attempt already recorded marks the run as a repeat, which moves nothing and answers applied
// when the job is in o.Status.
func (s *Store) Finish(ctx context.Context, id string, a *Attempt, o Outcome) (applied bool, err error) {
	var lastErr []byte
	if o.LastError != nil {
		if lastErr, err = json.Marshal(o.LastError); err != nil {
			return false, fmt.Errorf("encode last_error: %w", err)
		}
	}
	var dead *string
	if o.DeadReason != "" {
		reason := o.DeadReason // a copy: a pointer into o would move all of it to the heap
		dead = &reason
	}
	payload := emptyEventPayload
	if o.DeadReason != "" {
		b, err := json.Marshal(map[string]string{"reason": o.DeadReason})
		if err != nil {
			return false, fmt.Errorf("encode event: %w", err)
		}
		payload = b
	}
	rec := attemptRecord(a)
	// One statement (finishSQL; atomic, batched with other callers', see batcher).
	q := &finishQuery{status: textArg(o.Status), answeredBy: nullTextArg(o.AnsweredBy),
		credential: textArg(rec.credential), class: textArg(rec.class), startedAt: timestamptzArg(rec.startedAt),
		latencyMS: float8Arg(rec.latencyMS), ttfbMS: nullFloat8Arg(rec.ttfbMS)}
	q.args = [...]any{id, &q.status, nullJSON(o.Result), nullJSON(o.Usage), lastErr, dead,
		o.NextAttemptAt, &q.answeredBy, o.NextCredential, leaseOf(a),
		a != nil, rec.number, &q.credential, &q.startedAt, &q.latencyMS, &q.ttfbMS, rec.status, &q.class,
		rec.retryAfterMS, rec.delayMS, rec.err, payload, rec.usage}
	q.op = batchOp{ctx: ctx, key: id, sql: finishSQL, args: q.args[:], scan: q}
	err = s.batch.query(ctx, &q.op)
	if errors.Is(err, pgx.ErrNoRows) {
		if a != nil {
			err := s.keepLateUsage(ctx, id, o.Usage)
			if nullJSON(o.Usage) == nil {
				// Only the announcement failed: a live page reads the attempt at its keep-alive,
				// as before there was one; the record's caller has nothing to run again.
				err = nil
			}
			return false, err
		}
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("finish attempt: %w", err)
	}
	return true, nil
}

// emptyEventPayload is the payload of a Finish's event without a dead reason, boxed once.
var emptyEventPayload any = []byte(`{}`)

// finishQuery is Finish's statement in one allocation: its batchOp, its arguments' list, the
// values seven of its arguments point at (the status, the answering credential, the attempt's
// credential, class, start, latency and TTFB, as insertArgList's do: boxed, or a pointer pgx
// reads back through reflect, each was an allocation), and the scan of its row (the scan is q
// itself) with Scan's argument. As a list, a closure, the event_seq it scanned into and Scan's
// argument of their own they were 4 allocations at every job's end (TestFinish_Allocs).
type finishQuery struct {
	op                        batchOp
	args                      [23]any
	status, credential, class textArg
	answeredBy                nullTextArg
	startedAt                 timestamptzArg
	latencyMS                 float8Arg
	ttfbMS                    nullFloat8Arg
	seq                       int
	dest                      [1]any
}

func (q *finishQuery) scanRow(r pgx.Row) error {
	q.dest[0] = &q.seq
	return r.Scan(q.dest[:]...)
}

// keepLateUsage stores the usage of an answer that came after its job ended without one (a
// cancel, or the deadline pass, while the call was in flight) as the job's usage: the provider
// charged for it, and the job's usage is what its tenant reads of that. It is not a transition
// (no event), and a job that stored an answer of its own, or a usage already, keeps its own. It
// runs after Finish's statement found the job ended (or held by another delivery), so the end
// it reads is committed.
//
// Finish's statement recorded the attempt meanwhile, with no event either: so that a live page
// of the job (the console's) shows the attempt and the usage at once, not at its next
// keep-alive, the same statement announces the job on ChangesChannel, only for a watched job as
// the trigger of job_events announces a transition (NOTIFY serializes commits): the Listener
// signals its subscribers 0, "read the job again" (see Listener.Subscribe). A usage of nil
// stores none.
func (s *Store) keepLateUsage(ctx context.Context, id string, usage json.RawMessage) error {
	_, err := s.pool.Exec(ctx, `
WITH u AS (
	UPDATE jobs SET usage = $2
	WHERE id = $1 AND $2::jsonb IS NOT NULL AND status IN ('failed', 'dead', 'canceled') AND result IS NULL AND usage IS NULL)
SELECT pg_notify($3, $1::uuid::text)
WHERE EXISTS (SELECT 1 FROM job_watches WHERE job_id = $1 AND expires_at > now())`, id, nullJSON(usage), ChangesChannel)
	if err != nil {
		return fmt.Errorf("keep the usage of an answer to an ended job: %w", err)
	}
	return nil
}

// leaseOf is the lease token a Finish releases: its attempt's (nil: none).
func leaseOf(a *Attempt) *string {
	if a == nil || a.LeaseToken == "" {
		return nil
	}
	return &a.LeaseToken
}

// attemptColumns is an Attempt as job_attempts' columns (all zero for a nil Attempt).
type attemptColumns struct {
	number       int
	credential   string
	startedAt    time.Time
	latencyMS    float64
	ttfbMS       float64 // 0: none
	status       *int
	class        string
	retryAfterMS *int64
	delayMS      *int64
	err          *string
	usage        []byte
}

func attemptRecord(a *Attempt) attemptColumns {
	if a == nil {
		return attemptColumns{}
	}
	ms := func(d *time.Duration) *int64 {
		if d == nil {
			return nil
		}
		v := d.Milliseconds()
		return &v
	}
	r := attemptColumns{number: a.Number, credential: a.Credential, startedAt: a.StartedAt,
		latencyMS: float64(a.Latency) / float64(time.Millisecond), class: a.Class,
		retryAfterMS: ms(a.RetryAfter), delayMS: ms(a.Delay), usage: nullJSON(a.Usage)}
	if a.TTFB > 0 {
		r.ttfbMS = float64(a.TTFB) / float64(time.Millisecond)
	}
	if a.StatusCode != 0 {
		r.status = &a.StatusCode
	}
	if a.Error != "" {
		r.err = &a.Error
	}
	return r
}

// AttemptRow is a stored attempt, for ctl and tests.
type AttemptRow struct {
	Number       int       `json:"attempt"`
	Credential   string    `json:"credential"`
	StartedAt    time.Time `json:"started_at"`
	LatencyMS    float64   `json:"latency_ms"`
	TTFBMS       *float64  `json:"ttfb_ms"`
	StatusCode   *int      `json:"status_code"`
	Class        string    `json:"class"`
	RetryAfterMS *int64    `json:"retry_after_ms"`
	DelayMS      *int64    `json:"delay_ms"`
	Error        *string   `json:"error"`
	// Usage is what the provider counted for the attempt: its answer's (see Job.Usage), or what
	// a call that failed partway reported before it failed (Attempt.Usage); nil for an attempt
	// without either.
	Usage json.RawMessage `json:"usage,omitempty"`
}

// Attempts returns a job's attempts in order.
func (s *Store) Attempts(ctx context.Context, id string) ([]AttemptRow, error) {
	rows, err := s.pool.Query(ctx, `
SELECT attempt, credential, started_at, latency_ms, ttfb_ms, status_code, class, retry_after_ms, delay_ms, error, usage
FROM job_attempts WHERE job_id = $1 ORDER BY attempt`, id)
	if err != nil {
		return nil, fmt.Errorf("list attempts: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (AttemptRow, error) {
		var a AttemptRow
		err := r.Scan(&a.Number, &a.Credential, &a.StartedAt, &a.LatencyMS, &a.TTFBMS, &a.StatusCode,
			&a.Class, &a.RetryAfterMS, &a.DelayMS, &a.Error, &a.Usage)
		return a, err
	})
	if err != nil {
		return nil, fmt.Errorf("list attempts: %w", err)
	}
	return out, nil
}
