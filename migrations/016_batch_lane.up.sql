-- The batch lane (internal/batchlane): jobs that can wait go through the providers' batch APIs
-- at half the price.
--
-- provider_batches is one batch of jobs for one credential and model. Its row and its jobs'
-- batch_ref are committed BEFORE the batch is sent to the provider (state 'committed'), so a
-- leader that dies between the two finds the batch on restart and looks it up at the provider,
-- or sends it then: a job is in one batch at a time and never paid for twice by a crash.
CREATE TABLE provider_batches (
    id                uuid        PRIMARY KEY,
    credential        text        NOT NULL,
    model             text        NOT NULL,
    -- committed: jobs chosen, not yet sent; submitted: the provider has it (provider_batch_id);
    -- ended: its results were recorded; canceled: nothing left to send (every job ended first).
    state             text        NOT NULL CHECK (state IN ('committed', 'submitted', 'ended', 'canceled')),
    provider_batch_id text,
    -- The provider's own word for the batch's state, as last polled (in_progress, ended, ...).
    provider_state    text,
    -- requests is how many jobs the batch sends, frozen when its first send begins
    -- (submit_started_at): a send again after a crash sends the same jobs, and the provider's
    -- batch is recognised by that count where it keeps no metadata (Anthropic).
    requests          integer     NOT NULL DEFAULT 0,
    submit_started_at timestamptz,
    polls             integer     NOT NULL DEFAULT 0,
    next_poll_at      timestamptz,
    created_at        timestamptz NOT NULL DEFAULT now(),
    submitted_at      timestamptz,
    ended_at          timestamptz
);
CREATE INDEX provider_batches_open_idx ON provider_batches (created_at) WHERE state IN ('committed', 'submitted');

-- lane is the lane the job takes now: online (the executor, under the shared limiter) or batch
-- (the batcher; never a task in asynq). 'auto' is resolved at submit. batch_ref is the batch the
-- job is in (NULL: waiting for one, or online); batch_id and batch_state copy the provider's id
-- and state for the job's JSON (kept after the batch ends, as the job's history).
--
-- The constraints are added NOT VALID, as in migration 013: this ALTER holds an ACCESS
-- EXCLUSIVE lock on jobs (no read either) until the migration commits, and validating them read
-- the whole table under it (840 ms on a million jobs) although every existing row holds the
-- default and a NULL reference. New and updated rows are checked all the same. The indexes on
-- the new columns are migration 017's, built under a lock that lets reads through.
ALTER TABLE jobs
    ADD COLUMN lane        text NOT NULL DEFAULT 'online',
    ADD COLUMN batch_ref   uuid,
    ADD COLUMN batch_id    text,
    ADD COLUMN batch_state text;
ALTER TABLE jobs ADD CONSTRAINT jobs_lane_check CHECK (lane IN ('online', 'batch')) NOT VALID;
ALTER TABLE jobs ADD CONSTRAINT jobs_batch_ref_fkey
    FOREIGN KEY (batch_ref) REFERENCES provider_batches (id) ON DELETE SET NULL NOT VALID;
