package jobs

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/llmq/llmq/internal/idem"
	"github.com/llmq/llmq/internal/pgerr"
	"github.com/llmq/llmq/internal/pgwait"
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
	// ErrBusy: a cancel found the job's status changed under each of its tries (a dead job
	// retried and ending again, over and over, while it waited for the row's lock); it did
	// nothing, and a later try, once the job is left alone, takes.
	ErrBusy = errors.New("the job's status kept changing under the cancel")
	// ErrKeyBusy: a keyed Create found its idempotency key holding a job that was deleted
	// before it could be read, under each of its tries (retention or a purge deleting, again
	// and again, the job another submit of the key creates meanwhile); it stored nothing, and a
	// later try likely takes.
	ErrKeyBusy = errors.New("the idempotency key's job was deleted under each of the submit's tries")
)

// EventsChannel is the Postgres NOTIFY channel on which the transitions of watched jobs
// (Store.Watch) are announced, with payload "<job id>:<seq>"; other jobs' are not (a NOTIFY
// serializes commits).
const EventsChannel = "llmq_job_events"

// ChangesChannel is the Postgres NOTIFY channel on which a change of a watched job that makes no
// event is announced (an attempt Store.Finish recorded after the job ended, and the usage kept
// from it: see keepLateUsage), with the job's ID as payload: its readers read the job again. It
// is a channel apart so that a listener of the last release, which LISTENs on EventsChannel
// alone and logs every payload it cannot parse there, never receives it.
const ChangesChannel = "llmq_job_changes"

// Store is the Postgres job store: the source of truth. It is safe for concurrent use.
type Store struct {
	pool  *pgxpool.Pool
	batch *batcher  // the hot path's transitions, sent together under load
	plans scanPlans // pgx's scan plans for job rows, per connection
	now   func() time.Time
	newID func() (uuid.UUID, error) // a new job's ID: uuid.NewV7 (tests fix it)
	// beforeCancelRun, when not nil, is called before each run of cancelSQL with its number
	// (from 1): tests make the job's status change under the run.
	beforeCancelRun func(ctx context.Context, run int)
	// cancelPage is how many jobs a statement of cancelPages cancels: cancelPageSize (tests
	// make it smaller, for many pages of few jobs).
	cancelPage int
}

// NewStore returns a Store on pool. now is the clock of Prepare's job (its CreatedAt and
// Deadline, an estimate: the rows' deadlines are on Postgres's clock); nil means time.Now.
func NewStore(pool *pgxpool.Pool, now func() time.Time) *Store {
	return NewStoreOpts(pool, StoreOpts{Now: now})
}

// StoreOpts are a Store's knobs beyond its pool; zero fields take their defaults.
type StoreOpts struct {
	// Now is the clock of Prepare's job (see NewStore). Default time.Now.
	Now func() time.Time
	// BatchTimeout bounds one batch's round trip, past which its connection may be silent (see
	// batchTimeout). Default 10s; tests of a silent connection shorten it rather than wait.
	BatchTimeout time.Duration
	// LockTimeout bounds how long the batcher's statements wait for a row lock another session
	// holds (see batchLockTimeout), unless the session's own lock_timeout is shorter. Default 2s;
	// tests that tell a statement kept from a locked row from one behind it lengthen it, so the
	// wait they must not see cannot end within their deadline.
	LockTimeout time.Duration
}

// NewStoreOpts returns a Store on pool with opts.
func NewStoreOpts(pool *pgxpool.Pool, opts StoreOpts) *Store {
	if opts.Now == nil {
		opts.Now = time.Now
	}
	b := &batcher{pool: pool, timeout: opts.BatchTimeout}
	if opts.LockTimeout > 0 {
		b.lockArgs = []any{lockSetting(opts.LockTimeout)}
	}
	return &Store{pool: pool, batch: b, now: opts.Now, newID: uuid.NewV7, cancelPage: cancelPageSize}
}

// Pool returns the underlying pool.
func (s *Store) Pool() *pgxpool.Pool { return s.pool }

// CreateParams describe a new job.
type CreateParams struct {
	// ID is the job's ID when Prepare gave it one; empty: Create makes one. Only Prepare sets it:
	// Create takes a row with this ID for its own (a rerun after a lost commit answer).
	ID             string
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
	// Lane is the job's lane (empty: online). A batch-lane job is never enqueued: the batcher
	// collects it.
	Lane Lane
	// Priority orders the job among its tenant's waiting work; empty: PriorityNormal.
	Priority Priority
	// Admit, when set, is asked once the job is known to be new (its idempotency key, if any,
	// claimed; inside Create's transaction), with the job as it will be inserted (see Prepare),
	// whether its first attempt starts with the insert: a non-nil Begin creates the job running,
	// its attempt counted and leased as BeginAttempt would, in the same statement. For a caller
	// that admits the attempt (the rate limiter's slot) before the job exists: a replay asks
	// nothing, so takes no slot.
	Admit func(ctx context.Context, job *Job) *Begin
}

// Begin is the first attempt's start written with the job (CreateParams.Admit).
type Begin struct {
	// LeaseToken is the attempt's lease (Job.LeaseToken), held for AttemptLease from the commit.
	LeaseToken string
}

// Prepare gives p the ID its job will have (a new one when p has none) and returns the job as
// Create would insert it, before it exists (what CreateParams.Admit is given). Its CreatedAt
// and Deadline are this process's clock's, not the row's (whose deadline is on Postgres's).
func (s *Store) Prepare(p *CreateParams) (*Job, error) {
	if err := s.assignID(p); err != nil {
		return nil, err
	}
	now := s.now()
	job := &Job{ID: p.ID, Tenant: p.Tenant, Status: StatusQueued, Credential: p.Credential,
		MaxAttempts: p.MaxAttempts, Timeout: Duration(p.Timeout), Deadline: now.Add(p.Timeout), CreatedAt: now,
		Request: p.Request, Metadata: p.Metadata, Fallbacks: nonNil(p.Fallbacks),
		Lane: cmp.Or(p.Lane, LaneOnline), Priority: cmp.Or(p.Priority, PriorityNormal)}
	if p.AttemptTimeout > 0 {
		d := Duration(p.AttemptTimeout)
		job.AttemptTimeout = &d
	}
	if p.FirstByteTimeout > 0 {
		d := Duration(p.FirstByteTimeout)
		job.FirstByteTimeout = &d
	}
	return job, nil
}

// assignID gives p a new job ID unless it has one.
func (s *Store) assignID(p *CreateParams) error {
	if p.ID != "" {
		return nil
	}
	id, err := s.newID()
	if err != nil {
		return fmt.Errorf("new job id: %w", err)
	}
	p.ID = id.String()
	return nil
}

// jobColumns are a job's columns as scanJob reads them.
const jobColumns = jobColumnsBeforeRequest + ` request,` + jobColumnsAfterRequest

// jobColumnsNoRequest is jobColumns with a NULL request: for the transitions whose caller
// already holds the body (it never changes after Create), so a large one does not travel back,
// and for the lists of jobs (List, PageDead), which show no body (it is not in the job JSON).
// A constant, as jobColumns is, so that a statement of it is one too: made by strings.Replace at
// start, it was concatenated at every statement's call (a submit's, a start's, a stream's read).
const jobColumnsNoRequest = jobColumnsBeforeRequest + ` NULL::json AS request,` + jobColumnsAfterRequest

// jobColumnsNoPayload is jobColumns with a NULL request and a NULL result: for the console's job
// list (Page), which shows neither, so that a page's cost does not grow with its jobs' bodies and
// answers (500 answers of 800 kB made a page take 1.2 to 2 s instead of 0.06 s).
const jobColumnsNoPayload = jobColumnsBeforeResult + ` NULL::json AS result,` + jobColumnsAfterResult +
	` NULL::json AS request,` + jobColumnsAfterRequest

// jobColumnsBeforeResult, jobColumnsAfterResult (up to the request) and jobColumnsAfterRequest
// are jobColumns around its result and its request.
const (
	jobColumnsBeforeResult = `id::text, tenant, status, credential, idempotency_key, attempts, max_attempts,
	timeout_ms, deadline, created_at, started_at, finished_at, next_attempt_at, last_error,`
	jobColumnsAfterResult   = ` usage, dead_reason, metadata,`
	jobColumnsBeforeRequest = jobColumnsBeforeResult + ` result,` + jobColumnsAfterResult
	jobColumnsAfterRequest  = ` event_seq, slot_seq,
	attempt_timeout_ms, first_byte_timeout_ms, fallbacks, credential_index, answered_by, slot_grant,
	lease_token::text, lease_until, lane, batch_id, batch_state, priority`
)

// queryJob runs sql, a statement answering with one job's columns (scanJob), in a batch with
// other callers' (see batcher), ordered by the job's id.
func (s *Store) queryJob(ctx context.Context, id, sql string, args ...any) (*Job, error) {
	q := new(jobQuery)
	// args's list is the caller's, made on its stack for a variadic call: the batch may still
	// read the arguments after ctx's end, so they are q's own (copied, not kept, args does not
	// escape).
	return s.runJobQuery(ctx, q, id, sql, append(q.args[:0], args...))
}

// runJobQuery runs sql with args by the batcher and scans its row with q, which must own args
// (the batch may still read them after ctx's end).
func (s *Store) runJobQuery(ctx context.Context, q *jobQuery, id, sql string, args []any) (*Job, error) {
	q.s = s
	q.op = batchOp{ctx: ctx, key: id, sql: sql, args: args, scan: q}
	if err := s.batch.query(ctx, &q.op); err != nil {
		// q.job is not ours to read: after ctx's end, the batch may still be scanning into it.
		return nil, err
	}
	return q.job, nil
}

// jobQuery is a statement of queryJob in one allocation: its batchOp, its arguments (up to a
// transition's three) and the scan of its row (the scan is q itself). As a closure, the Job's
// pointer it wrote, the arguments' list and the batchOp they were 4 allocations at every
// read and transition of a job (TestGet_Allocs).
type jobQuery struct {
	op   batchOp
	s    *Store
	job  *Job
	args [3]any
}

func (q *jobQuery) scanRow(r pgx.Row) (err error) {
	q.job, err = q.s.scanJob(r)
	return err
}

// jobColumnCount is how many columns jobColumns (jobColumnsNoRequest, jobColumnsNoPayload) has.
const jobColumnCount = 33

// jobScan is the Job scanJob reads a row into and what it reads the row with, in one
// allocation: the Job, the values its pointer fields point to, the columns that are converted
// into the Job's fields once read, the row's destinations, the scanner and Scan's argument. As
// variables of their own they were 11 allocations a row, and the Job and its jobScan 2, scanned
// on every submit, poll and transition of a job (TestScanJob_Allocs). The Job's pointer keeps
// the rest alive, about 600 bytes beside the Job's own, for as long as the Job is kept.
type jobScan struct {
	job                    Job
	costClass              string
	attempt, firstByte     Duration
	timeoutMS              int64
	lastErr                []byte
	attemptMS, firstByteMS *int64
	scanner                rowScanner
	arg                    [1]any
	// dest holds a job's columns and up to two columns of its statement's after them (cancel's
	// and a tenant's offboarding's flags); more are appended.
	dest [jobColumnCount + 2]any
}

// scanJob reads a row of jobColumns (or jobColumnsNoRequest, jobColumnsNoPayload) into a Job, and the row's columns
// after those (when the statement answers more) into extra.
func (s *Store) scanJob(row pgx.Row, extra ...any) (*Job, error) {
	sc := new(jobScan)
	j := &sc.job
	// The JSON columns are read as bytes (their fields' underlying type): Postgres has checked
	// them, and pgx would check them again (json.Unmarshal) for a json.RawMessage.
	sc.dest = [...]any{&j.ID, &j.Tenant, &j.Status, &j.Credential, &j.IdempotencyKey, &j.Attempts,
		&j.MaxAttempts, &sc.timeoutMS, &j.Deadline, &j.CreatedAt, &j.StartedAt, &j.FinishedAt,
		&j.NextAttemptAt, &sc.lastErr, (*[]byte)(&j.Result), (*[]byte)(&j.Usage), &j.DeadReason,
		(*[]byte)(&j.Metadata), (*[]byte)(&j.Request), &j.EventSeq, &j.SlotSeq, &sc.attemptMS,
		&sc.firstByteMS, &j.Fallbacks, &j.CredentialIndex, &j.AnsweredBy, &j.SlotGrant,
		&j.LeaseToken, &j.LeaseUntil, &j.Lane, &j.BatchID, &j.BatchState, &j.Priority, nil, nil}
	sc.scanner = rowScanner{p: &s.plans, dest: append(sc.dest[:jobColumnCount], extra...)}
	sc.arg[0] = &sc.scanner
	err := row.Scan(sc.arg[:]...)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, ErrNotFound
	}
	if err != nil {
		return nil, err
	}
	j.Timeout = Duration(time.Duration(sc.timeoutMS) * time.Millisecond)
	if j.Status == StatusSucceeded {
		sc.costClass = string(j.Lane)
		j.CostClass = &sc.costClass
	}
	if sc.attemptMS != nil {
		sc.attempt = Duration(time.Duration(*sc.attemptMS) * time.Millisecond)
		j.AttemptTimeout = &sc.attempt
	}
	if sc.firstByteMS != nil {
		sc.firstByte = Duration(time.Duration(*sc.firstByteMS) * time.Millisecond)
		j.FirstByteTimeout = &sc.firstByte
	}
	if sc.lastErr != nil {
		j.LastError = new(LastError)
		if err := json.Unmarshal(sc.lastErr, j.LastError); err != nil {
			return nil, fmt.Errorf("decode last_error: %w", err)
		}
	}
	return j, nil
}

// Create inserts a job and its "queued" event in one transaction and returns it (when p.Admit
// answers a Begin, also its first attempt's start and "running" event). With an idempotency key
// already used by the same body (same fingerprint) it returns the existing job and
// replayed=true; with a different body, ErrIdempotencyKeyReused. Concurrent creates with one
// key yield exactly one job. When the key's job was deleted before it was read under each of
// keyedTries tries, it stores nothing and returns ErrKeyBusy (wrapped).
func (s *Store) Create(ctx context.Context, p CreateParams) (job *Job, replayed bool, err error) {
	if err := s.assignID(&p); err != nil {
		return nil, false, err
	}
	id := p.ID
	if p.Metadata == nil {
		p.Metadata = json.RawMessage("{}")
	}
	if p.IdempotencyKey == "" {
		// No key to claim: one statement, batched with other callers' (see batcher).
		begin, err := s.admit(ctx, &p)
		if err != nil {
			return nil, false, err
		}
		q := new(insertQuery)
		sql := insertJobInto(&q.args, id, nil, p, begin)
		job, err = s.runJobQuery(ctx, &q.jobQuery, id, sql, q.args.list[:])
		if isJobIDTaken(err) {
			// The batcher runs a failed batch's statements again one by one. When the batch's
			// connection dropped after its commit, this insert already took effect: the ID is
			// this call's own fresh UUIDv7, so the row holding it is the job this call created.
			// Answering a duplicate key instead would fail a submit whose job exists (and that
			// the sweeper would run), inviting the client to pay for it twice.
			// It exists: its read waits for a connection without a pgwait bound, whose
			// refusal would say nothing was stored.
			job, err = s.ownJob(pgwait.Unbound(ctx), id, p, err)
		}
		if err != nil {
			return nil, false, createError(err)
		}
		job.Request = p.Request // insertJob does not send the body back
		return job, false, nil
	}
	for range keyedTries {
		job, replayed, err = s.createKeyed(ctx, id, p)
		if !errors.Is(err, errReplayGone) {
			break
		}
	}
	if errors.Is(err, errReplayGone) {
		// Nothing was stored (each try rolled back): a passing refusal, not the server's failure.
		return nil, false, fmt.Errorf("create job: %w (%d tries)", ErrKeyBusy, keyedTries)
	}
	if err != nil && IsUnavailable(err) {
		// The connection broke: when the commit had been sent, the job may be stored (and the
		// sweeper will run it), its answer lost, or its commit still on its way. Answering the
		// failure would say it was not stored, and a serve process would drop the first attempt
		// its insert started. The key says which: Replay's claim waits for a claim still in
		// flight (this call's own transaction, on a server that has not yet heard its commit or
		// its connection's end), as the client's resend would; a read by job ID would not. The
		// key holding this call's own fresh UUIDv7 is the job this call created; another job of
		// this body under the key (this call's claim rolled back, another's since) is a replay.
		// Its wait for a connection has no pgwait bound, as the keyless path's read-back has not.
		if own, rerr := s.Replay(pgwait.Unbound(ctx), p.Tenant, p.IdempotencyKey, p.Fingerprint); rerr == nil {
			return own, own.ID != id, nil
		}
	}
	if err != nil {
		return nil, false, createError(err)
	}
	return job, replayed, nil
}

// keyedTries is how many times Create claims a key whose job keeps being deleted before it is
// read (errReplayGone) before it answers ErrKeyBusy.
const keyedTries = 3

// errReplayGone: the job a key was found for was deleted before it was read (retention or a
// purge, whose cascade deletes the key too): claiming the key again makes a new job.
var errReplayGone = errors.New("the key's job was deleted meanwhile")

// createKeyed is Create's transaction for a job with an idempotency key: it claims the key and
// inserts the job, or reads the job the key holds (errReplayGone when it was deleted since).
func (s *Store) createKeyed(ctx context.Context, id string, p CreateParams) (job *Job, replayed bool, err error) {
	err = pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		c, err := idem.ClaimKey(ctx, tx, p.Tenant, p.IdempotencyKey, p.Fingerprint, id)
		if err != nil {
			return err
		}
		if !c.Claimed {
			if !c.Matches(p.Fingerprint) {
				return ErrIdempotencyKeyReused
			}
			job, err = s.scanJob(tx.QueryRow(ctx, `SELECT `+jobColumns+` FROM jobs WHERE id = $1`, c.JobID))
			if errors.Is(err, ErrNotFound) {
				return errReplayGone
			}
			replayed = true
			return err
		}
		begin, err := s.admit(ctx, &p)
		if err != nil {
			return err
		}
		sql, args := insertJob(id, &p.IdempotencyKey, p, begin)
		if job, err = s.scanJob(tx.QueryRow(ctx, sql, args...)); err != nil {
			return err
		}
		job.Request = p.Request // insertJob does not send the body back
		return nil
	})
	return job, replayed, err
}

// Replay returns the job that tenant's idempotency key was claimed for by a body of this
// fingerprint, or ErrNotFound when the key is unused or was used with another body. It is for
// a submit the API refuses as a new job (its configuration changed since the key's job was
// created): the same body again must still answer the key's job, which exists and may have run.
// Create reads its key back with it too, when its connection broke around its commit.
//
// Like Create, it waits for a claim of the key not yet committed (the key's first submit, on a
// replica that accepted the body, still in flight): it claims the key itself, for a job ID never
// inserted, in a transaction always rolled back. A plain read would miss that claim and answer
// the refusal ("nothing stored") for a job about to commit.
func (s *Store) Replay(ctx context.Context, tenant, key, fingerprint string) (*Job, error) {
	id, err := s.newID()
	if err != nil {
		return nil, fmt.Errorf("replay idempotency key: new job id: %w", err)
	}
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("replay idempotency key: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }() // nothing of it is kept
	c, err := idem.ClaimKey(ctx, tx, tenant, key, fingerprint, id.String())
	if err != nil {
		return nil, fmt.Errorf("replay idempotency key: %w", err)
	}
	if c.Claimed || !c.Matches(fingerprint) {
		return nil, ErrNotFound
	}
	job, err := s.scanJob(tx.QueryRow(ctx, `SELECT `+jobColumns+` FROM jobs WHERE id = $1`, c.JobID))
	if err != nil && !errors.Is(err, ErrNotFound) {
		return nil, fmt.Errorf("replay idempotency key: %w", err)
	}
	return job, err
}

// admit is p.Admit's answer for p's job (nil without Admit).
func (s *Store) admit(ctx context.Context, p *CreateParams) (*Begin, error) {
	if p.Admit == nil {
		return nil, nil
	}
	job, err := s.Prepare(p)
	if err != nil {
		return nil, err
	}
	return p.Admit(ctx, job), nil
}

// isJobIDTaken reports whether err is an insert's conflict on the jobs' primary key.
func isJobIDTaken(err error) bool {
	pgErr, ok := errors.AsType[*pgconn.PgError](err) // not errors.As, whose target is moved to the heap
	return ok && pgErr.Code == "23505" && pgErr.ConstraintName == "jobs_pkey"
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
// notifies), answering with the job's columns but its request (scanJob). With begin the job is
// inserted running, its first attempt counted and leased, and its "running" event follows. The
// deadline is the timeout from Postgres's clock_timestamp(), not from this host's clock: a
// skewed API host would move every job's deadline by its skew.
func insertJob(id string, key *string, p CreateParams, begin *Begin) (string, []any) {
	a := new(insertArgList)
	return insertJobInto(a, id, key, p, begin), a.list[:]
}

// insertJobInto is insertJob writing its arguments into a.
func insertJobInto(a *insertArgList, id string, key *string, p CreateParams, begin *Begin) string {
	var lease *string
	if begin != nil {
		lease = &begin.LeaseToken
	}
	a.tenant, a.credential, a.timeoutMS = textArg(p.Tenant), textArg(p.Credential), int8Arg(p.Timeout.Milliseconds())
	a.list = [insertArgs]any{id, &a.tenant, &a.credential, key, p.Fingerprint, []byte(p.Request), p.MaxAttempts,
		&a.timeoutMS, []byte(p.Metadata), positiveMS(p.AttemptTimeout),
		positiveMS(p.FirstByteTimeout), nonNil(p.Fallbacks), laneArg(p.Lane), priorityArg(p.Priority),
		lease, attemptLeaseMS}
	return `
WITH j AS (
	INSERT INTO jobs (id, tenant, credential, idempotency_key, fingerprint, status, request,
		max_attempts, timeout_ms, deadline, metadata, event_seq, attempt_timeout_ms, first_byte_timeout_ms, fallbacks,
		lane, batch_state, priority, attempts, started_at, lease_token, lease_until)
	VALUES ($1, $2, $3, $4, $5, CASE WHEN $15::uuid IS NULL THEN 'queued' ELSE 'running' END, $6, $7, $8::bigint, clock_timestamp() + $8::bigint * interval '1 millisecond', $9,
		CASE WHEN $15::uuid IS NULL THEN 1 ELSE 2 END, $10, $11, $12,
		$13, CASE WHEN $13 = 'batch' THEN 'waiting' END, $14,
		CASE WHEN $15::uuid IS NULL THEN 0 ELSE 1 END, CASE WHEN $15::uuid IS NOT NULL THEN now() END,
		$15::uuid, CASE WHEN $15::uuid IS NOT NULL THEN clock_timestamp() + $16 * interval '1 millisecond' END)
	RETURNING *
), e AS (
	INSERT INTO job_events (job_id, seq, type, payload) SELECT id, 1, 'queued', '{}'::jsonb FROM j
	UNION ALL SELECT id, 2, 'running', '{"attempt": 1}'::jsonb FROM j WHERE lease_token IS NOT NULL
)
SELECT ` + jobColumnsNoRequest + ` FROM j`
}

// insertArgs is how many arguments insertJob's statement takes.
const insertArgs = 16

// insertQuery is a keyless Create's statement in one allocation: the jobQuery that runs it and
// scans its row, and insertJob's arguments. Apart they were 2 allocations at every submit.
type insertQuery struct {
	jobQuery
	args insertArgList
}

// insertArgList is insertJob's arguments and the values three of them point at (the tenant, the
// credential and the timeout, never constants): boxing a pointer into an argument does not
// allocate, boxing each value did.
type insertArgList struct {
	list       [insertArgs]any
	tenant     textArg
	credential textArg
	timeoutMS  int8Arg
}

// textArg is a text argument that pgx encodes from its pointer through pgtype.TextValuer,
// without reflection (pgx reads a *string's value back through reflect, boxing it again).
type textArg string

// TextValue implements pgtype.TextValuer: the string, never NULL.
func (a *textArg) TextValue() (pgtype.Text, error) {
	return pgtype.Text{String: string(*a), Valid: true}, nil
}

// int8Arg is a bigint argument that pgx encodes from its pointer through pgtype.Int64Valuer.
type int8Arg int64

// Int64Value implements pgtype.Int64Valuer: the integer, never NULL.
func (a *int8Arg) Int64Value() (pgtype.Int8, error) {
	return pgtype.Int8{Int64: int64(*a), Valid: true}, nil
}

// timestamptzArg is a timestamptz argument that pgx encodes from its pointer through
// pgtype.TimestamptzValuer, as it encodes a time.Time.
type timestamptzArg time.Time

// TimestamptzValue implements pgtype.TimestamptzValuer: the time, never NULL.
func (a *timestamptzArg) TimestamptzValue() (pgtype.Timestamptz, error) {
	return pgtype.Timestamptz{Time: time.Time(*a), Valid: true}, nil
}

// float8Arg is a double precision argument that pgx encodes from its pointer through
// pgtype.Float64Valuer, as it encodes a float64.
type float8Arg float64

// Float64Value implements pgtype.Float64Valuer: the number, never NULL.
func (a *float8Arg) Float64Value() (pgtype.Float8, error) {
	return pgtype.Float8{Float64: float64(*a), Valid: true}, nil
}

// nullTextArg is a text argument that pgx encodes from its pointer through pgtype.TextValuer,
// NULL when empty.
type nullTextArg string

// TextValue implements pgtype.TextValuer: the string, NULL when empty.
func (a *nullTextArg) TextValue() (pgtype.Text, error) {
	return pgtype.Text{String: string(*a), Valid: *a != ""}, nil
}

// nullFloat8Arg is a double precision argument that pgx encodes from its pointer through
// pgtype.Float64Valuer, NULL when 0.
type nullFloat8Arg float64

// Float64Value implements pgtype.Float64Valuer: the number, NULL when 0.
func (a *nullFloat8Arg) Float64Value() (pgtype.Float8, error) {
	return pgtype.Float8{Float64: float64(*a), Valid: *a != 0}, nil
}

// attemptLeaseMS is AttemptLease in milliseconds, boxed once (an argument of insertJob,
// BeginAttempt and RenewLease).
var attemptLeaseMS any = AttemptLease.Milliseconds()

// laneArg is insertJob's argument for the lane l (LaneOnline when empty): a lane's name boxed
// from a constant (not allocated) when it is one.
func laneArg(l Lane) any {
	switch l {
	case "", LaneOnline:
		return string(LaneOnline)
	case LaneBatch:
		return string(LaneBatch)
	}
	return string(l)
}

// priorityArg is insertJob's argument for the priority p (PriorityNormal when empty), boxed
// from a constant (not allocated) when it is one.
func priorityArg(p Priority) any {
	switch p {
	case "", PriorityNormal:
		return PriorityNormal
	case PriorityHigh:
		return PriorityHigh
	case PriorityLow:
		return PriorityLow
	}
	return p
}

// Get returns the job with that ID, or ErrNotFound. A malformed ID is ErrNotFound too.
func (s *Store) Get(ctx context.Context, id string) (*Job, error) {
	return s.get(ctx, id, `SELECT `+jobColumns+` FROM jobs WHERE id = $1`)
}

// GetWithoutRequest is Get without the job's request (Request is nil): for a reader that sends
// the job's state but never its body (an event stream's reads), so that a body of up to
// api.max_body_bytes does not travel from Postgres at every read.
func (s *Store) GetWithoutRequest(ctx context.Context, id string) (*Job, error) {
	return s.get(ctx, id, `SELECT `+jobColumnsNoRequest+` FROM jobs WHERE id = $1`)
}

// get reads the job with that ID by sql (its columns jobColumns or jobColumnsNoRequest, $1 the
// ID), or ErrNotFound, for a malformed ID too.
func (s *Store) get(ctx context.Context, id, sql string) (*Job, error) {
	if !ValidID(id) {
		return nil, ErrNotFound
	}
	j, err := s.queryJob(ctx, id, sql, id)
	if err != nil && !errors.Is(err, ErrNotFound) {
		return nil, fmt.Errorf("get job: %w", err)
	}
	return j, err
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

// IsUnavailable reports whether err means Postgres could not be reached or dropped the
// connection (as opposed to a bad query or a constraint), so the API can answer 503 rather than
// 500. See pgerr.Unavailable; a statement run Alone and not sent for want of a connection beside
// the batches (see IsLockTimeout) is unavailable too.
func IsUnavailable(err error) bool { return pgerr.Unavailable(err) || isBesideFull(err) }
