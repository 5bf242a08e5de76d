-- Two leader-only maintenance passes of the workers (internal/maintenance) read jobs by time.
--
-- The deadline pass fails every unfinished job whose deadline has passed, oldest deadline first,
-- every second: without this index each pass would read the whole backlog.
CREATE INDEX jobs_unfinished_deadline_idx ON jobs (deadline) WHERE status IN ('queued', 'running', 'retrying');

-- The retention pass deletes a final status's jobs that finished before a cutoff, oldest first.
-- finished_at is set exactly when a job is final (every transition to succeeded, failed, dead or
-- canceled sets it; ctl dead retry clears it). ListDead and ctl stats read the same order, so this
-- index replaces jobs_dead_idx (one index more per final transition, not two).
CREATE INDEX jobs_finished_idx ON jobs (status, finished_at) WHERE finished_at IS NOT NULL;
DROP INDEX jobs_dead_idx;

-- Deleting a job cascades to its idempotency key by job_id (the key's foreign key); without an
-- index that cascade reads the whole key table once per deleted job.
CREATE INDEX idempotency_keys_job_id_idx ON idempotency_keys (job_id);
