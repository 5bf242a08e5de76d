-- The batch lane's indexes on jobs (migration 016's columns), in a migration of their own: built
-- in 016's transaction they read the whole table under its ACCESS EXCLUSIVE lock (1 s on a
-- million jobs, every read of jobs waiting); here they hold the SHARE lock of CREATE INDEX, which
-- lets reads through. IF NOT EXISTS: a database migrated before the split built them in 016.

-- The batcher collects the jobs waiting for a batch, oldest first.
CREATE INDEX IF NOT EXISTS jobs_batch_waiting_idx ON jobs (credential, created_at)
    WHERE lane = 'batch' AND batch_ref IS NULL AND status IN ('queued', 'retrying');
CREATE INDEX IF NOT EXISTS jobs_batch_ref_idx ON jobs (batch_ref) WHERE batch_ref IS NOT NULL;
