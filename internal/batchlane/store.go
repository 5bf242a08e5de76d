package batchlane

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/llmq/llmq/internal/jobs"
)

// store is the batch lane's Postgres: provider_batches and the batch columns of jobs (migration
// 016). Job transitions follow internal/jobs' rules: one statement with its event (a trigger
// notifies), conditional on the job being unfinished AND still in the batch that decides it, so
// a late result never overwrites a job that ended or left the batch (canceled, fell back
// online).
type store struct{ pool *pgxpool.Pool }

// Pending reports whether Postgres holds batch-lane work: a job waiting for a batch, or a batch
// not yet ended. A worker whose config enables no batch lane runs a Batcher all the same when it
// does (see Batcher: a lane turned off sends its waiting jobs online and polls the batches it
// has), so that turning the last lane off does not leave them to their deadline. Both reads
// are through the batch lane's partial indexes.
func Pending(ctx context.Context, pool *pgxpool.Pool) (bool, error) {
	var pending bool
	err := pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM provider_batches WHERE state IN ('committed', 'submitted'))
	OR EXISTS (SELECT 1 FROM jobs WHERE lane = 'batch' AND batch_ref IS NULL AND status IN ('queued', 'retrying'))`).Scan(&pending)
	if err != nil {
		return false, fmt.Errorf("look for batch-lane work: %w", err)
	}
	return pending, nil
}

// waitingJob is a batch-lane job not yet in a batch.
type waitingJob struct {
	ID        string
	Model     string
	CreatedAt time.Time
	Deadline  time.Time
	// Bytes is the length of its request as stored.
	Bytes int64
}

// waiting returns up to limit jobs of credential waiting for a batch, oldest first.
func (s store) waiting(ctx context.Context, credential string, limit int) ([]waitingJob, error) {
	rows, err := s.pool.Query(ctx, `SELECT id::text, coalesce(request->>'model', ''), created_at, deadline, octet_length(request::text) FROM jobs
WHERE lane = 'batch' AND batch_ref IS NULL AND status IN ('queued', 'retrying') AND credential = $1
ORDER BY created_at LIMIT $2`, credential, limit)
	if err != nil {
		return nil, fmt.Errorf("list jobs waiting for a batch: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (w waitingJob, err error) {
		err = r.Scan(&w.ID, &w.Model, &w.CreatedAt, &w.Deadline, &w.Bytes)
		return w, err
	})
	if err != nil {
		return nil, fmt.Errorf("list jobs waiting for a batch: %w", err)
	}
	return out, nil
}

// unconfigured returns the credentials, other than configured, that jobs waiting for a batch
// name: credentials removed from this process's config, or added by a newer one. One probe of
// the batch lane's waiting index per credential (a skip scan), however many jobs wait.
func (s store) unconfigured(ctx context.Context, configured []string) ([]string, error) {
	rows, err := s.pool.Query(ctx, `WITH RECURSIVE c AS (
	(SELECT credential FROM jobs WHERE lane = 'batch' AND batch_ref IS NULL AND status IN ('queued', 'retrying')
	ORDER BY credential LIMIT 1)
	UNION ALL
	SELECT (SELECT j.credential FROM jobs j WHERE j.lane = 'batch' AND j.batch_ref IS NULL AND j.status IN ('queued', 'retrying')
		AND j.credential > c.credential ORDER BY j.credential LIMIT 1) FROM c WHERE c.credential IS NOT NULL
)
SELECT credential FROM c WHERE credential IS NOT NULL AND NOT (credential = ANY($1::text[]))`, configured)
	if err != nil {
		return nil, fmt.Errorf("list the credentials of jobs waiting for a batch: %w", err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("list the credentials of jobs waiting for a batch: %w", err)
	}
	return out, nil
}

// errEmpty: none of the jobs a batch was to hold could still join it.
var errEmpty = errors.New("no job left for the batch")

// errNotDue: a committed batch's send is claimed by another send under way, or waits out a
// failed send's backoff (see beginSend).
var errNotDue = errors.New("the batch's send is not due")

// commit inserts batch id and puts ids in it, in one transaction, before anything is sent: a
// job joins only while it waits (unfinished, in the batch lane, in no batch), so it is in one
// batch at a time. It returns how many joined, or errEmpty (nothing is stored then).
func (s store) commit(ctx context.Context, id, credential, model string, ids []string) (int, error) {
	var n int64
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO provider_batches (id, credential, model, state) VALUES ($1, $2, $3, 'committed')`,
			id, credential, model); err != nil {
			return err
		}
		tag, err := tx.Exec(ctx, `UPDATE jobs SET batch_ref = $1, batch_state = 'committed', updated_at = now()
WHERE id = ANY($2::uuid[]) AND lane = 'batch' AND batch_ref IS NULL AND status IN ('queued', 'retrying')`, id, ids)
		if err != nil {
			return err
		}
		if n = tag.RowsAffected(); n == 0 {
			return errEmpty
		}
		return nil
	})
	if errors.Is(err, errEmpty) {
		return 0, err
	}
	if err != nil {
		return 0, fmt.Errorf("commit batch: %w", err)
	}
	return int(n), nil
}

// batchRow is an open batch (committed or submitted).
type batchRow struct {
	ID, Credential, Model, State string
	ProviderID, ProviderState    *string
	Requests, Polls              int
	SubmitStartedAt, SubmittedAt *time.Time
	NextPollAt                   *time.Time
}

// open returns the batches not yet ended, oldest first.
func (s store) open(ctx context.Context) ([]batchRow, error) {
	rows, err := s.pool.Query(ctx, `SELECT id::text, credential, model, state, provider_batch_id, provider_state, requests, polls,
	submit_started_at, submitted_at, next_poll_at
FROM provider_batches WHERE state IN ('committed', 'submitted') ORDER BY created_at`)
	if err != nil {
		return nil, fmt.Errorf("list open batches: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (b batchRow, err error) {
		err = r.Scan(&b.ID, &b.Credential, &b.Model, &b.State, &b.ProviderID, &b.ProviderState, &b.Requests, &b.Polls,
			&b.SubmitStartedAt, &b.SubmittedAt, &b.NextPollAt)
		return b, err
	})
	if err != nil {
		return nil, fmt.Errorf("list open batches: %w", err)
	}
	return out, nil
}

// beginSend freezes what committed batch id sends, the first time it is called for it: the jobs
// that ended meanwhile leave the batch (batch_state canceled, as their cancel set it, or not_sent:
// failed at their deadline), and the count of the rest is
// recorded with the time the send began. Every call returns the requests of the batch's jobs
// still unfinished, in job order (less those that left it since: moved online near their
// deadline; canceled since an earlier send, which stay in it, are not sent again but may be in
// a batch that send made), and the start and size of the last send (this one, the first time;
// see resend); no job left in the batch: errEmpty
// (the batch is marked canceled, nothing to send). A call again may return no request: every job
// was canceled since an earlier send, which may still have to be looked up.
//
// Each call claims the send until claimUntil (the batch's next_poll_at, which send reads before
// it begins, and which the send's outcome replaces: the first poll, or a failed send's backoff).
// A call while another's claim holds (now before it) sends nothing and returns errNotDue: the
// other send may still be on its way to the provider (a leader whose lock connection was cut
// sends on until its next check), and looked up before it lands, the batch would be sent twice.
func (s store) beginSend(ctx context.Context, id string, now, claimUntil time.Time) ([]Request, time.Time, int, error) {
	var reqs []Request
	var since time.Time
	var last int
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		var started, due *time.Time
		if err := tx.QueryRow(ctx, `SELECT submit_started_at, next_poll_at FROM provider_batches WHERE id = $1 FOR UPDATE`,
			id).Scan(&started, &due); err != nil {
			return err
		}
		if due != nil && now.Before(*due) {
			return errNotDue
		}
		if started == nil {
			if _, err := tx.Exec(ctx, `UPDATE jobs SET batch_ref = NULL, updated_at = now(),
	batch_state = CASE WHEN status = 'canceled' THEN 'canceled' ELSE 'not_sent' END
WHERE batch_ref = $1 AND status NOT IN ('queued', 'running', 'retrying')`, id); err != nil {
				return err
			}
		}
		// In the ids' uuid order (jobs.id: a bare id is the output column id::text, ordered by
		// the database's collation), as store.jobs reads them.
		rows, err := tx.Query(ctx, `SELECT id::text, request, status IN ('queued', 'running', 'retrying') FROM jobs
WHERE batch_ref = $1 ORDER BY jobs.id`, id)
		if err != nil {
			return err
		}
		type member struct {
			req  Request
			live bool
		}
		all, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (m member, err error) {
			err = r.Scan(&m.req.CustomID, &m.req.Body, &m.live)
			return m, err
		})
		if err != nil {
			return err
		}
		for _, m := range all {
			if m.live {
				reqs = append(reqs, m.req)
			}
		}
		if len(all) == 0 {
			if _, err := tx.Exec(ctx, `UPDATE provider_batches SET state = 'canceled', ended_at = now() WHERE id = $1`, id); err != nil {
				return err
			}
			return errEmpty
		}
		return tx.QueryRow(ctx, `UPDATE provider_batches SET submit_started_at = coalesce(submit_started_at, now()),
	requests = CASE WHEN submit_started_at IS NULL THEN $2 ELSE requests END, next_poll_at = $3
WHERE id = $1 RETURNING submit_started_at, requests`, id, len(reqs), claimUntil).Scan(&since, &last)
	})
	if errors.Is(err, errEmpty) || errors.Is(err, errNotDue) {
		return nil, time.Time{}, 0, err
	}
	if err != nil {
		return nil, time.Time{}, 0, fmt.Errorf("begin sending batch: %w", err)
	}
	return reqs, since, last, nil
}

// resend records that batch id is sent again, now, with n requests: what a look-up after it
// (should its answer be lost) looks for (Client.Find), as beginSend records the first send's.
// A batch's sends shrink as its jobs leave it, and only its last can be at the provider (each
// send again follows a look-up that found none); looked up by the first send's size and time, a
// smaller lost send is not found and is sent again, or another of llmq's lost batches is taken
// for it.
func (s store) resend(ctx context.Context, id string, n int) error {
	if _, err := s.pool.Exec(ctx, `UPDATE provider_batches SET submit_started_at = now(), requests = $2 WHERE id = $1`,
		id, n); err != nil {
		return fmt.Errorf("record a batch's send again: %w", err)
	}
	return nil
}

// findWindow is how long before a send's start the provider batches of other rows are read for
// Find to pass over: beyond its own minute of clock skew, room for the time between a batch's
// creation at the provider and its record here.
const findWindow = 10 * time.Minute

// providerIDs returns the provider batch ids recorded for credential's batches other than id
// since the time given: the batches a look-up for id must not adopt.
func (s store) providerIDs(ctx context.Context, credential, id string, since time.Time) (map[string]bool, error) {
	rows, err := s.pool.Query(ctx, `SELECT provider_batch_id FROM provider_batches
WHERE credential = $1 AND id <> $2 AND provider_batch_id IS NOT NULL AND submitted_at >= $3`, credential, id, since)
	if err != nil {
		return nil, fmt.Errorf("read recorded provider batches: %w", err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("read recorded provider batches: %w", err)
	}
	out := make(map[string]bool, len(ids))
	for _, v := range ids {
		out[v] = true
	}
	return out, nil
}

// submitted records that the provider holds batch id as providerID: the batch's jobs still
// unfinished become running, each counting one attempt, with their event.
func (s store) submitted(ctx context.Context, id, providerID string, nextPoll time.Time) error {
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `UPDATE provider_batches SET state = 'submitted', provider_batch_id = $2,
	provider_state = 'in_progress', submitted_at = now(), next_poll_at = $3, polls = 0 WHERE id = $1`, id, providerID, nextPoll); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `
WITH u AS (
	UPDATE jobs SET status = 'running', attempts = attempts + 1, started_at = coalesce(started_at, now()),
		next_attempt_at = NULL, batch_id = $2, batch_state = 'in_progress', updated_at = now(), event_seq = event_seq + 1
	WHERE batch_ref = $1 AND status IN ('queued', 'retrying')
	RETURNING id, event_seq, attempts
)
INSERT INTO job_events (job_id, seq, type, payload)
SELECT id, event_seq, 'running', jsonb_build_object('attempt', attempts, 'batch_id', $2::text) FROM u`, id, providerID)
		return err
	})
	if err != nil {
		return fmt.Errorf("record submitted batch: %w", err)
	}
	return nil
}

// polled records a poll's answer and when to poll next; the batch's unfinished jobs, and those
// canceled while in it, show the provider's state (see followedBatch).
func (s store) polled(ctx context.Context, id, providerState string, nextPoll time.Time) error {
	_, err := s.pool.Exec(ctx, `
WITH b AS (
	UPDATE provider_batches SET provider_state = $2, polls = polls + 1, next_poll_at = $3 WHERE id = $1
)
UPDATE jobs SET batch_state = $2, updated_at = now()
WHERE batch_ref = $1 AND `+followedBatch+` AND batch_state IS DISTINCT FROM $2`, id, providerState, nextPoll)
	if err != nil {
		return fmt.Errorf("record batch poll: %w", err)
	}
	return nil
}

// pollLater sets when batch id is polled next, after a poll that failed (the provider or the
// network), so that a provider outage is polled with the same backoff, not on every pass.
func (s store) pollLater(ctx context.Context, id string, next time.Time) error {
	if _, err := s.pool.Exec(ctx, `UPDATE provider_batches SET polls = polls + 1, next_poll_at = $2 WHERE id = $1`, id, next); err != nil {
		return fmt.Errorf("record failed batch poll: %w", err)
	}
	return nil
}

// endClaim ends a committed batch's send claim (see beginSend) after a send the provider
// refused without taking it: the next pass that may send it does.
func (s store) endClaim(ctx context.Context, id string) error {
	if _, err := s.pool.Exec(ctx, `UPDATE provider_batches SET next_poll_at = NULL WHERE id = $1 AND state = 'committed'`, id); err != nil {
		return fmt.Errorf("end the send claim of batch %s: %w", id, err)
	}
	return nil
}

// ended marks batch id ended (or canceled: nothing was left to wait for); providerState ""
// (never sent) is stored as NULL.
func (s store) ended(ctx context.Context, id, state, providerState string) error {
	if err := endBatch(ctx, s.pool, id, state, providerState); err != nil {
		return fmt.Errorf("end batch: %w", err)
	}
	return nil
}

// execer is a pool or a transaction.
type execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// followedBatch is the SQL condition of a job in a batch (batch_ref) whose batch_state follows
// the batch's provider state: an unfinished job, and one canceled while in the batch, which the
// provider may still be running (its cancel reaches the provider only once none of the batch's
// jobs waits): it showed the state last polled before its cancel (in_progress) for good. A job
// the batch answered (succeeded, failed) keeps the state its answer was recorded at.
const followedBatch = `status IN ('queued', 'running', 'retrying', 'canceled')`

// endBatch is ended's statement, through q. The batch's jobs canceled while in it show the state
// it ended in (providerState; "": never sent, and they keep theirs), as those it answered do.
func endBatch(ctx context.Context, q execer, id, state, providerState string) error {
	_, err := q.Exec(ctx, `
WITH j AS (
	UPDATE jobs SET batch_state = $3, updated_at = now()
	WHERE batch_ref = $1 AND status = 'canceled' AND $3::text IS NOT NULL AND batch_state IS DISTINCT FROM $3
)
UPDATE provider_batches SET state = $2, provider_state = $3, ended_at = now(), next_poll_at = NULL
WHERE id = $1`, id, state, nullString(providerState))
	return err
}

// batchJob is a job of a batch as the outcome mapping needs it.
type batchJob struct {
	ID          string
	Status      string
	Attempts    int
	MaxAttempts int
	Deadline    time.Time
	// Refused counts the job's attempt rows the provider refused for its capacity (429, 503,
	// 529, in either lane, or an expired batch request), read by record for a job whose result
	// is such a refusal only (store.refusals): it bounds the rounds a job gives back (see
	// capacityStatus).
	Refused int
}

// unfinished reports whether the job may still change.
func (j batchJob) unfinished() bool {
	return j.Status == "queued" || j.Status == "running" || j.Status == "retrying"
}

// jobs returns batch id's jobs, in the order of their ids as uuids (jobs.id: a bare id is the
// output column id::text, ordered by the database's collation).
func (s store) jobs(ctx context.Context, id string) ([]batchJob, error) {
	rows, err := s.pool.Query(ctx, `SELECT id::text, status, attempts, max_attempts, deadline FROM jobs WHERE batch_ref = $1 ORDER BY jobs.id`, id)
	if err != nil {
		return nil, fmt.Errorf("list batch jobs: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (j batchJob, err error) {
		err = r.Scan(&j.ID, &j.Status, &j.Attempts, &j.MaxAttempts, &j.Deadline)
		return j, err
	})
	if err != nil {
		return nil, fmt.Errorf("list batch jobs: %w", err)
	}
	return out, nil
}

// refusals returns, for each of jobs ids that has any, the number of its attempt rows the
// provider refused for its capacity (429, 503, 529, or a batch request it let expire, whose row
// holds expiredMessage; batchJob.Refused).
func (s store) refusals(ctx context.Context, ids []string) (map[string]int, error) {
	out := make(map[string]int)
	if len(ids) == 0 {
		return out, nil
	}
	rows, err := s.pool.Query(ctx, `SELECT job_id::text, count(*) FROM job_attempts
WHERE job_id = ANY($1::text[]::uuid[])
	AND (status_code IN (429, 503, 529) OR (status_code IS NULL AND error = $2))
GROUP BY job_id`, ids, expiredMessage)
	if err != nil {
		return nil, fmt.Errorf("count refused attempts: %w", err)
	}
	var id string
	var n int
	if _, err := pgx.ForEachRow(rows, []any{&id, &n}, func() error {
		out[id] = n
		return nil
	}); err != nil {
		return nil, fmt.Errorf("count refused attempts: %w", err)
	}
	return out, nil
}

// move is one transition of a job decided in the batch lane.
type move struct {
	JobID string
	// Ref is the batch the job must still be in (nil: the job must be waiting in no batch).
	Ref *string
	// Status is the new status; Lane the lane it goes on in (succeeded, failed, dead: unchanged).
	Status     string
	Lane       string
	Result     json.RawMessage
	Usage      json.RawMessage
	LastError  map[string]any
	DeadReason string
	// BatchState is the job's batch_state after the move.
	BatchState string
	// GiveBack gives the attempt the job's send counted (store.submitted) back: the job's
	// attempts go down by one, and attempt_base up by one, so that its attempt row keeps its
	// number and the next round's gets the next. Only a job running in the batch has one to give.
	GiveBack bool
	// Attempt, when the job was running in a submitted batch, is recorded as its attempt.
	AttemptStarted time.Time
	AttemptLatency time.Duration
	AttemptStatus  int
	AttemptClass   string
	AttemptError   string
}

// apply makes m in one statement, conditional on the job being unfinished, in the batch lane and
// still in m.Ref (nil: waiting for a batch); ok reports whether it applied, and priority is the
// job's (it names the task's queue when the job goes back online). A job that leaves the batch
// (retrying, online, dead) leaves batch_ref; one that succeeds or fails keeps it as its history.
// The lane is checked because a job sent online (by another leader's pass that overlapped this
// one's, both having read it waiting) has no batch_ref either: moved again, it was put back to
// queued under the executor's attempt, which found its own attempt row written (the job's own
// credential, not the fallback it ran on) and recorded nothing. The job's usage becomes m.Usage,
// its answer's (nil: none, or no answer), as jobs.Store.Finish writes it: never an earlier round's.
func (s store) apply(ctx context.Context, m move) (priority jobs.Priority, ok bool, err error) {
	var lastErr []byte
	if m.LastError != nil {
		var err error
		if lastErr, err = json.Marshal(m.LastError); err != nil {
			return "", false, fmt.Errorf("encode last_error: %w", err)
		}
	}
	payload := map[string]any{"lane": m.Lane}
	if m.DeadReason != "" {
		payload["reason"] = m.DeadReason
	}
	pl, _ := json.Marshal(payload)
	var prio *string
	err = s.pool.QueryRow(ctx, `
WITH a AS (
	INSERT INTO job_attempts (job_id, attempt, credential, started_at, latency_ms, status_code, class, error)
	SELECT id, attempts + attempt_base, credential, $3::timestamptz, $4::double precision, $5::integer, $6::text, $7::text
	FROM jobs WHERE id = $1 AND lane = 'batch' AND batch_ref IS NOT DISTINCT FROM $2::uuid AND status = 'running'
	ON CONFLICT (job_id, attempt) DO NOTHING
), u AS (
	UPDATE jobs SET status = $8, lane = $9, result = coalesce($10, result), usage = $11::jsonb,
		last_error = coalesce($12, last_error), dead_reason = $13,
		attempts = attempts - CASE WHEN $16 AND status = 'running' AND attempts > 0 THEN 1 ELSE 0 END,
		attempt_base = attempt_base
			+ CASE WHEN $16 AND status = 'running' AND attempts > 0 THEN 1 ELSE 0 END,
		answered_by = CASE WHEN $8 = 'succeeded' THEN credential ELSE answered_by END,
		batch_ref = CASE WHEN $8 IN ('succeeded', 'failed') THEN batch_ref END,
		batch_state = $14, next_attempt_at = NULL,
		finished_at = CASE WHEN $8 IN ('succeeded', 'failed', 'dead', 'canceled') THEN now() END,
		updated_at = now(), event_seq = event_seq + 1
	WHERE id = $1 AND lane = 'batch' AND batch_ref IS NOT DISTINCT FROM $2::uuid
		AND status IN ('queued', 'running', 'retrying')
	RETURNING id, event_seq, priority
), e AS (
	INSERT INTO job_events (job_id, seq, type, payload) SELECT id, event_seq, $8, $15 FROM u
)
SELECT count(*) = 1, max(priority) FROM u`, m.JobID, m.Ref, m.AttemptStarted, float64(m.AttemptLatency)/float64(time.Millisecond),
		nullInt(m.AttemptStatus), m.AttemptClass, nullString(m.AttemptError), m.Status, m.Lane, nullJSON(m.Result), nullJSON(m.Usage),
		lastErr, nullString(m.DeadReason), nullString(m.BatchState), pl, m.GiveBack).Scan(&ok, &prio)
	if err != nil {
		return "", false, fmt.Errorf("move job %s: %w", m.JobID, err)
	}
	if prio != nil {
		priority = jobs.Priority(*prio)
	}
	return priority, ok, nil
}

// keepLateUsage stores usage (nil: nothing) as the usage of job id, canceled while in batch ref,
// when it has none: the provider charged for an answer no result is stored for, as the online
// lane keeps one that came after a cancel (jobs.Store.Finish). It appends no event; a results
// file read again changes nothing.
func (s store) keepLateUsage(ctx context.Context, id, ref string, usage json.RawMessage) error {
	if usage == nil {
		return nil
	}
	if _, err := s.pool.Exec(ctx, `UPDATE jobs SET usage = $3
WHERE id = $1 AND batch_ref = $2::uuid AND status = 'canceled' AND result IS NULL AND usage IS NULL`, id, ref, usage); err != nil {
		return fmt.Errorf("keep the usage of job %s's answer after its cancel: %w", id, err)
	}
	return nil
}

func nullString(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

func nullInt(v int) *int {
	if v == 0 {
		return nil
	}
	return &v
}

func nullJSON(b json.RawMessage) []byte {
	if len(b) == 0 {
		return nil
	}
	return b
}
