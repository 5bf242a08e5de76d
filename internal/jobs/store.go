package jobs

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/llmq/llmq/internal/idem"
	"github.com/llmq/llmq/internal/pgerr"
)

// Errors returned by the Store.
var (
	// ErrNotFound: no job with that ID (for that tenant).
	ErrNotFound = errors.New("job not found")
	// ErrIdempotencyKeyReused: the key was used before with a different body.
	ErrIdempotencyKeyReused = errors.New("idempotency key reused with a different request")
	// ErrNotRunnable: the job is terminal, so no attempt may start.
	ErrNotRunnable = errors.New("job is terminal")
	// ErrUnstorable: Create was given a value its columns cannot hold (jsonb refuses \u0000 and
	// unpaired surrogate escapes). Only client data reaches Postgres after validation: a 400.
	ErrUnstorable = errors.New("the body holds a value that cannot be stored (e.g. \\u0000 or an unpaired surrogate escape in metadata)")
)

// EventsChannel is the Postgres NOTIFY channel on which every transition is announced, with
// payload "<job id>:<seq>".
const EventsChannel = "llmq_job_events"

// Store is the Postgres job store: the source of truth. It is safe for concurrent use.
type Store struct {
	pool  *pgxpool.Pool
	batch *batcher // the hot path's transitions, sent together under load
	now   func() time.Time
	newID func() (uuid.UUID, error) // a new job's ID: uuid.NewV7 (tests fix it)
}

// NewStore returns a Store on pool. now is the clock used for deadlines; nil means time.Now.
func NewStore(pool *pgxpool.Pool, now func() time.Time) *Store {
	if now == nil {
		now = time.Now
	}
	return &Store{pool: pool, batch: &batcher{pool: pool}, now: now, newID: uuid.NewV7}
}

// Pool returns the underlying pool.
func (s *Store) Pool() *pgxpool.Pool { return s.pool }

// CreateParams describe a new job.
type CreateParams struct {
	Tenant         string
	Credential     string
	IdempotencyKey string // empty: none
	Fingerprint    string // of the submit body, compared when the key is used again (empty: no key)
	Request        json.RawMessage
	MaxAttempts    int
	Timeout        time.Duration
	Metadata       json.RawMessage // nil: {}
	// AttemptTimeout and FirstByteTimeout override the credential's limits for this job; 0 keeps
	// the credential's.
	AttemptTimeout   time.Duration
	FirstByteTimeout time.Duration
	// Fallbacks are credentials (of the same provider kind) tried in order after retryable
	// failures on Credential.
	Fallbacks []string
}

const jobColumns = `id::text, tenant, status, credential, idempotency_key, attempts, max_attempts,
	timeout_ms, deadline, created_at, started_at, finished_at, next_attempt_at, last_error,
	result, usage, dead_reason, metadata, request, event_seq, slot_seq,
	attempt_timeout_ms, first_byte_timeout_ms, fallbacks, credential_index, answered_by, slot_grant,
	lease_token::text, lease_until`

// jobColumnsNoRequest is jobColumns with a NULL request: for the transitions whose caller
// already holds the body (it never changes after Create), so a large one does not travel back.
var jobColumnsNoRequest = strings.Replace(jobColumns, " request,", " NULL::json AS request,", 1)

// queryJob runs sql, a statement answering with one job's columns (scanJob), in a batch with
// other callers' (see batcher), ordered by the job's id.
func (s *Store) queryJob(ctx context.Context, id, sql string, args ...any) (*Job, error) {
	var job *Job
	err := s.batch.queryRow(ctx, id, sql, args, func(r pgx.Row) (err error) {
		job, err = scanJob(r)
		return err
	})
	return job, err
}

func scanJob(row pgx.Row) (*Job, error) {
	var j Job
	var timeoutMS int64
	var lastErr []byte
	var attemptMS, firstByteMS *int64
	err := row.Scan(&j.ID, &j.Tenant, &j.Status, &j.Credential, &j.IdempotencyKey, &j.Attempts,
		&j.MaxAttempts, &timeoutMS, &j.Deadline, &j.CreatedAt, &j.StartedAt, &j.FinishedAt,
		&j.NextAttemptAt, &lastErr, &j.Result, &j.Usage, &j.DeadReason, &j.Metadata, &j.Request,
		&j.EventSeq, &j.SlotSeq, &attemptMS, &firstByteMS, &j.Fallbacks, &j.CredentialIndex, &j.AnsweredBy, &j.SlotGrant,
		&j.LeaseToken, &j.LeaseUntil)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, ErrNotFound
	}
	if err != nil {
		return nil, err
	}
	j.Timeout = Duration(time.Duration(timeoutMS) * time.Millisecond)
	if attemptMS != nil {
		d := Duration(time.Duration(*attemptMS) * time.Millisecond)
		j.AttemptTimeout = &d
	}
	if firstByteMS != nil {
		d := Duration(time.Duration(*firstByteMS) * time.Millisecond)
		j.FirstByteTimeout = &d
	}
	if lastErr != nil {
		j.LastError = new(LastError)
		if err := json.Unmarshal(lastErr, j.LastError); err != nil {
			return nil, fmt.Errorf("decode last_error: %w", err)
		}
	}
	return &j, nil
}

// Create inserts a job and its "queued" event in one transaction and returns it. With an
// idempotency key already used by the same body (same fingerprint) it returns the existing job
// and replayed=true; with a different body, ErrIdempotencyKeyReused. Concurrent creates with one
// key yield exactly one job.
func (s *Store) Create(ctx context.Context, p CreateParams) (job *Job, replayed bool, err error) {
	id, err := s.newID()
	if err != nil {
		return nil, false, fmt.Errorf("new job id: %w", err)
	}
	if p.Metadata == nil {
		p.Metadata = json.RawMessage("{}")
	}
	if p.IdempotencyKey == "" {
		// No key to claim: one statement, batched with other callers' (see batcher).
		sql, args := insertJob(id.String(), nil, s.now().Add(p.Timeout), p)
		job, err = s.queryJob(ctx, id.String(), sql, args...)
		if isJobIDTaken(err) {
			// The batcher runs a failed batch's statements again one by one. When the batch's
			// connection dropped after its commit, this insert already took effect: the ID is
			// this call's own fresh UUIDv7, so the row holding it is the job this call created.
			// Answering a duplicate key instead would fail a submit whose job exists (and that
			// the sweeper would run), inviting the client to pay for it twice.
			job, err = s.ownJob(ctx, id.String(), p, err)
		}
		if err != nil {
			return nil, false, createError(err)
		}
		job.Request = p.Request // insertJob does not send the body back
		return job, false, nil
	}
	err = pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		c, err := idem.ClaimKey(ctx, tx, p.Tenant, p.IdempotencyKey, p.Fingerprint, id.String())
		if err != nil {
			return err
		}
		if !c.Claimed {
			if !c.Matches(p.Fingerprint) {
				return ErrIdempotencyKeyReused
			}
			job, err = scanJob(tx.QueryRow(ctx, `SELECT `+jobColumns+` FROM jobs WHERE id = $1`, c.JobID))
			replayed = true
			return err
		}
		sql, args := insertJob(id.String(), &p.IdempotencyKey, s.now().Add(p.Timeout), p)
		if job, err = scanJob(tx.QueryRow(ctx, sql, args...)); err != nil {
			return err
		}
		job.Request = p.Request // insertJob does not send the body back
		return nil
	})
	if err != nil {
		return nil, false, createError(err)
	}
	return job, replayed, nil
}

// isJobIDTaken reports whether err is an insert's conflict on the jobs' primary key.
func isJobIDTaken(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "23505" && pgErr.ConstraintName == "jobs_pkey"
}

// ownJob returns job id, which this Create inserted in an earlier try, or conflict when the row
// is not one this Create could have written (another tenant or credential, or an idempotency key).
func (s *Store) ownJob(ctx context.Context, id string, p CreateParams, conflict error) (*Job, error) {
	job, err := s.Get(ctx, id)
	if err != nil {
		return nil, err
	}
	if job.Tenant != p.Tenant || job.Credential != p.Credential || job.IdempotencyKey != nil {
		return nil, conflict
	}
	return job, nil
}

// createError turns Create's failure into the error it returns (nil stays nil).
func createError(err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && strings.HasPrefix(pgErr.Code, "22") {
		// A data exception: a value the columns cannot hold (jsonb refuses \u0000 and unpaired
		// surrogate escapes). Only client data reaches here after validation: a 400, not a 500.
		return ErrUnstorable
	}
	if err != nil {
		return fmt.Errorf("create job: %w", err)
	}
	return nil
}

// insertJob is the statement that inserts a queued job and its first event (a trigger
// notifies), answering with the job's columns but its request (scanJob).
func insertJob(id string, key *string, deadline time.Time, p CreateParams) (string, []any) {
	return `
WITH j AS (
	INSERT INTO jobs (id, tenant, credential, idempotency_key, fingerprint, status, request,
		max_attempts, timeout_ms, deadline, metadata, event_seq, attempt_timeout_ms, first_byte_timeout_ms, fallbacks)
	VALUES ($1, $2, $3, $4, $5, 'queued', $6, $7, $8, $9, $10, 1, $11, $12, $13)
	RETURNING *
), e AS (
	INSERT INTO job_events (job_id, seq, type, payload) SELECT id, 1, 'queued', '{}' FROM j
)
SELECT ` + jobColumnsNoRequest + ` FROM j`,
		[]any{id, p.Tenant, p.Credential, key, p.Fingerprint, []byte(p.Request), p.MaxAttempts,
			p.Timeout.Milliseconds(), deadline, []byte(p.Metadata), positiveMS(p.AttemptTimeout),
			positiveMS(p.FirstByteTimeout), nonNil(p.Fallbacks)}
}

// Get returns the job with that ID, or ErrNotFound. A malformed ID is ErrNotFound too.
func (s *Store) Get(ctx context.Context, id string) (*Job, error) {
	if !validID(id) {
		return nil, ErrNotFound
	}
	j, err := s.queryJob(ctx, id, `SELECT `+jobColumns+` FROM jobs WHERE id = $1`, id)
	if err != nil && !errors.Is(err, ErrNotFound) {
		return nil, fmt.Errorf("get job: %w", err)
	}
	return j, err
}

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
SELECT `+jobColumnsNoRequest+` FROM u`, id, AttemptLease.Milliseconds(), token)
	if err == nil {
		return job, nil
	}
	if !errors.Is(err, ErrNotFound) {
		return nil, fmt.Errorf("begin attempt: %w", err)
	}
	// Not runnable: say whether a live lease is why (or the job is terminal or missing). The
	// lease may be this call's own: its first run committed, and its answer was lost.
	job, err = scanJob(s.pool.QueryRow(ctx, `SELECT `+jobColumnsNoRequest+` FROM jobs
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
WHERE id = $1 AND lease_token = $2::uuid AND status = 'running'`, id, token, AttemptLease.Milliseconds())
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
// delivery that comes back for it sends then without reserving again. It is not a transition (no
// event) and applies only to a job waiting for an attempt (see waitingForAttempt).
func (s *Store) HoldSlot(ctx context.Context, id string, sendAt time.Time, seq, grant int64) error {
	_, err := s.pool.Exec(ctx, `UPDATE jobs SET next_attempt_at = $2, slot_seq = $3, slot_grant = $4, updated_at = now()
WHERE id = $1 AND `+waitingForAttempt, id, sendAt, seq, grant)
	if err != nil {
		return fmt.Errorf("hold limiter slot: %w", err)
	}
	return nil
}

// Postpone sets the time before which the job's next delivery must not send (a breaker
// cooldown, a pause, a spent retry budget). A held limiter slot is kept: sending later than a
// slot is always safe. It is not a transition (no event) and applies only to a job waiting for
// an attempt (see waitingForAttempt).
func (s *Store) Postpone(ctx context.Context, id string, until time.Time) error {
	_, err := s.pool.Exec(ctx, `UPDATE jobs SET next_attempt_at = $2, updated_at = now()
WHERE id = $1 AND `+waitingForAttempt, id, until)
	if err != nil {
		return fmt.Errorf("postpone job: %w", err)
	}
	return nil
}

// NextCredential moves a job waiting for an attempt (see waitingForAttempt) to its next fallback
// credential, without an attempt (the current one is refused by its breaker or paused). It
// reports whether it moved.
func (s *Store) NextCredential(ctx context.Context, id string) (bool, error) {
	tag, err := s.pool.Exec(ctx, `UPDATE jobs SET credential_index = credential_index + 1, slot_seq = NULL, slot_grant = NULL,
	next_attempt_at = NULL, updated_at = now()
WHERE id = $1 AND `+waitingForAttempt+` AND credential_index < cardinality(fallbacks)`, id)
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
	TTFB       time.Duration // 0: no body byte arrived
	StatusCode int           // 0: no HTTP answer
	Class      string
	RetryAfter *time.Duration
	Delay      *time.Duration // the wait chosen before the next attempt
	Error      string
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

// Finish records an attempt (when not nil; its lease is released) and moves the job to o.Status with its result or
// error, in one transaction. The move is conditional on the job not being terminal already, so a
// duplicate delivery can never store a second result: applied is false when it was terminal.
func (s *Store) Finish(ctx context.Context, id string, a *Attempt, o Outcome) (applied bool, err error) {
	var lastErr []byte
	if o.LastError != nil {
		if lastErr, err = json.Marshal(o.LastError); err != nil {
			return false, fmt.Errorf("encode last_error: %w", err)
		}
	}
	var dead *string
	if o.DeadReason != "" {
		dead = &o.DeadReason
	}
	payload := []byte(`{}`)
	if o.DeadReason != "" {
		if payload, err = json.Marshal(map[string]string{"reason": o.DeadReason}); err != nil {
			return false, fmt.Errorf("encode event: %w", err)
		}
	}
	rec := attemptRecord(a)
	// One statement (atomic; batched with other callers', see batcher): the attempt (recorded
	// even when the job has ended meanwhile: the call was made; numbered after the attempts of
	// earlier rounds, see jobs.attempt_base), the conditional move, and its event; a trigger
	// notifies.
	var seq int
	err = s.batch.queryRow(ctx, id, `
WITH a AS (
	INSERT INTO job_attempts (job_id, attempt, credential, started_at, latency_ms, ttfb_ms, status_code,
		class, retry_after_ms, delay_ms, error)
	SELECT id, $12::integer + attempt_base, $13::text, $14::timestamptz, $15::double precision, $16::double precision,
		$17::integer, $18::text, $19::bigint, $20::bigint, $21::text
	FROM jobs WHERE id = $1 AND $11::boolean
	ON CONFLICT (job_id, attempt) DO NOTHING
), u AS (
	UPDATE jobs SET status = $2, result = coalesce($3, result), usage = coalesce($4, usage),
		last_error = coalesce($5, last_error), dead_reason = $6, next_attempt_at = $7,
		answered_by = coalesce($8, answered_by),
		credential_index = credential_index + CASE WHEN $9 THEN 1 ELSE 0 END,
		lease_until = CASE WHEN lease_token = $10::uuid THEN NULL ELSE lease_until END,
		lease_token = CASE WHEN lease_token = $10::uuid THEN NULL ELSE lease_token END,
		finished_at = CASE WHEN $2 IN ('succeeded', 'failed', 'dead', 'canceled') THEN now() END,
		updated_at = now(), event_seq = event_seq + 1
	WHERE id = $1 AND status IN ('queued', 'running', 'retrying')
	RETURNING id, event_seq
), e AS (
	INSERT INTO job_events (job_id, seq, type, payload) SELECT id, event_seq, $2, $22 FROM u
)
SELECT event_seq FROM u`, []any{id, o.Status, nullJSON(o.Result), nullJSON(o.Usage), lastErr, dead, o.NextAttemptAt,
		nullString(o.AnsweredBy), o.NextCredential, leaseOf(a),
		a != nil, rec.number, rec.credential, rec.startedAt, rec.latencyMS, rec.ttfbMS, rec.status, rec.class,
		rec.retryAfterMS, rec.delayMS, rec.err, payload}, func(r pgx.Row) error { return r.Scan(&seq) })
	if errors.Is(err, pgx.ErrNoRows) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("finish attempt: %w", err)
	}
	return true, nil
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
	ttfbMS       *float64
	status       *int
	class        string
	retryAfterMS *int64
	delayMS      *int64
	err          *string
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
		retryAfterMS: ms(a.RetryAfter), delayMS: ms(a.Delay)}
	if a.TTFB > 0 {
		v := float64(a.TTFB) / float64(time.Millisecond)
		r.ttfbMS = &v
	}
	if a.StatusCode != 0 {
		r.status = &a.StatusCode
	}
	if a.Error != "" {
		r.err = &a.Error
	}
	return r
}

// appendEvent inserts event seq for a job; a trigger (migration 009) notifies listeners on
// EventsChannel when the transaction commits.
func appendEvent(ctx context.Context, tx pgx.Tx, id string, seq int, typ Status, payload map[string]any) error {
	if payload == nil {
		payload = map[string]any{}
	}
	b, err := json.Marshal(payload)
	if err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, `INSERT INTO job_events (job_id, seq, type, payload) VALUES ($1, $2, $3, $4)`,
		id, seq, string(typ), b); err != nil {
		return fmt.Errorf("insert event: %w", err)
	}
	return nil
}

func nullString(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

// positiveMS is d in milliseconds, or NULL when d is not positive.
func positiveMS(d time.Duration) *int64 {
	if d <= 0 {
		return nil
	}
	ms := d.Milliseconds()
	return &ms
}

func nullJSON(b json.RawMessage) []byte {
	if len(b) == 0 {
		return nil
	}
	return b
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
}

// Attempts returns a job's attempts in order.
func (s *Store) Attempts(ctx context.Context, id string) ([]AttemptRow, error) {
	rows, err := s.pool.Query(ctx, `
SELECT attempt, credential, started_at, latency_ms, ttfb_ms, status_code, class, retry_after_ms, delay_ms, error
FROM job_attempts WHERE job_id = $1 ORDER BY attempt`, id)
	if err != nil {
		return nil, fmt.Errorf("list attempts: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (AttemptRow, error) {
		var a AttemptRow
		err := r.Scan(&a.Number, &a.Credential, &a.StartedAt, &a.LatencyMS, &a.TTFBMS, &a.StatusCode,
			&a.Class, &a.RetryAfterMS, &a.DelayMS, &a.Error)
		return a, err
	})
	if err != nil {
		return nil, fmt.Errorf("list attempts: %w", err)
	}
	return out, nil
}

// Unfinished is a non-terminal job as the sweeper sees it.
type Unfinished struct {
	ID            string
	Status        Status
	NextAttemptAt *time.Time
	// LeaseUntil is when the running attempt's lease ends (nil: no lease).
	LeaseUntil *time.Time
}

// Leased reports whether a live attempt lease holds the job at now (its delivery is alive).
func (u Unfinished) Leased(now time.Time) bool {
	return u.Status == StatusRunning && u.LeaseUntil != nil && u.LeaseUntil.After(now)
}

// UnfinishedByID returns those of the jobs ids that are not terminal (malformed and unknown IDs
// are left out), in no particular order.
func (s *Store) UnfinishedByID(ctx context.Context, ids []string) ([]Unfinished, error) {
	valid := make([]string, 0, len(ids))
	for _, id := range ids {
		if validID(id) {
			valid = append(valid, id)
		}
	}
	if len(valid) == 0 {
		return nil, nil
	}
	rows, err := s.pool.Query(ctx, `SELECT id::text, status, next_attempt_at, lease_until FROM jobs
WHERE id = ANY($1::uuid[]) AND status IN ('queued', 'running', 'retrying')`, valid)
	if err != nil {
		return nil, fmt.Errorf("read unfinished jobs: %w", err)
	}
	out, err := pgx.CollectRows(rows, scanUnfinished)
	if err != nil {
		return nil, fmt.Errorf("read unfinished jobs: %w", err)
	}
	return out, nil
}

// scanUnfinished reads a row of id::text, status, next_attempt_at, lease_until.
func scanUnfinished(r pgx.CollectableRow) (Unfinished, error) {
	var u Unfinished
	err := r.Scan(&u.ID, &u.Status, &u.NextAttemptAt, &u.LeaseUntil)
	return u, err
}

// ListUnfinished returns up to limit non-terminal jobs with IDs after `after`, in ID order
// (keyset pagination: each page costs the same however large the table).
func (s *Store) ListUnfinished(ctx context.Context, after string, limit int) ([]Unfinished, error) {
	if after == "" {
		after = uuid.Nil.String()
	}
	var out []Unfinished
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, listUnfinishedSettings); err != nil {
			return err
		}
		rows, err := tx.Query(ctx, listUnfinishedSQL, after, limit)
		if err != nil {
			return err
		}
		out, err = pgx.CollectRows(rows, scanUnfinished)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("list unfinished jobs: %w", err)
	}
	return out, nil
}

// listUnfinishedSQL is one page of ListUnfinished: it must read jobs_unfinished_idx in order
// from $1 and stop after $2 rows, or every page costs the whole backlog (a sweep of N unfinished
// jobs then costs N²/500). Two things broke that before: ORDER BY id named the text output column
// (id::text), which no index orders, so each page sorted every unfinished job; and without
// table statistics (a fresh database, or autovacuum off as on our test machines) the planner
// estimates a handful of rows and picks a bitmap scan and a sort. listUnfinishedSettings rules
// the sort out for the page's transaction.
const listUnfinishedSQL = `
SELECT id::text, status, next_attempt_at, lease_until FROM jobs
WHERE status IN ('queued', 'running', 'retrying') AND id > $1
ORDER BY jobs.id LIMIT $2`

const listUnfinishedSettings = `SET LOCAL enable_sort = off`

// IsUnavailable reports whether err means Postgres could not be reached or dropped the
// connection (as opposed to a bad query or a constraint), so the API can answer 503 rather than
// 500. See pgerr.Unavailable.
func IsUnavailable(err error) bool { return pgerr.Unavailable(err) }
