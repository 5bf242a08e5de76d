-- The per-job write path pays for every row-level check on it. Measured with pgbench on the
-- statements of one job (create, begin attempt, finish), the foreign keys of job_events and
-- job_attempts and the attempt-numbering trigger cost about a fifth of Postgres's CPU per job:
-- each event or attempt insert ran a referential check (a row lock on the job) and a plpgsql call.
-- Both children are only ever written by statements that hold the job's row (the same CTE that
-- inserts or updates it), so the key cannot dangle; PurgeDead deletes them with their jobs, and
-- Finish numbers the attempt from jobs.attempt_base in the same statement.
ALTER TABLE job_events DROP CONSTRAINT job_events_job_id_fkey;
ALTER TABLE job_attempts DROP CONSTRAINT job_attempts_job_id_fkey;
DROP TRIGGER job_attempts_number ON job_attempts;
DROP FUNCTION llmq_number_attempt();
