DROP INDEX idempotency_keys_job_id_idx;
CREATE INDEX jobs_dead_idx ON jobs (finished_at) WHERE status = 'dead';
DROP INDEX jobs_finished_idx;
DROP INDEX jobs_unfinished_deadline_idx;
