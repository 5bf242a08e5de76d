-- The files the batch lane keeps at a provider (OpenAI's batch input, output and error files,
-- which count against the organisation's storage until they expire; Anthropic's batches have
-- none), recorded as soon as their ids are known: an input file when its upload is answered,
-- before the batch is created; an ended batch's files (input, output, error) in the transaction
-- that closes it. The batch lane's leader deletes, in its pass, the files of closed batches
-- (provider_batches.state ended or canceled, or its row deleted by retention) and the uploads
-- that never became a batch (released), retrying a delete that failed after next_try_at, at most
-- a bounded number of attempts; a file deleted (or one the provider no longer has) loses its row
-- at once. A row whose attempts ran out is kept for the operator (last_error says why).
--
-- A new table only, no foreign key: a batcher of the last release, which knows nothing of it,
-- may lead while this release's workers run (it closes batches without recording their files,
-- which the next leader of this release then deletes through the join on batch), and retention
-- deletes provider_batches rows without looking here.
CREATE TABLE provider_batch_files (
    credential  text        NOT NULL,
    file_id     text        NOT NULL,
    -- batch is the provider_batches row the file belongs to.
    batch       uuid        NOT NULL,
    -- upload: uploaded by a send (the batch's input file, or an upload whose create failed);
    -- ended: listed by the ended batch (input, output, error).
    kind        text        NOT NULL CHECK (kind IN ('upload', 'ended')),
    -- released: an upload no batch reads (its create failed, and a send again looked the batch
    -- up and found none): deleted without waiting for the batch's close.
    released    boolean     NOT NULL DEFAULT false,
    attempts    integer     NOT NULL DEFAULT 0,
    -- next_try_at: when the next delete may be tried; -infinity (due at once) until one failed,
    -- so that the worker's clock, which the pass compares it with, need not agree with the
    -- database's.
    next_try_at timestamptz NOT NULL DEFAULT '-infinity',
    last_error  text,
    created_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (credential, file_id)
);
CREATE INDEX provider_batch_files_batch_idx ON provider_batch_files (batch);
CREATE INDEX provider_batch_files_next_try_idx ON provider_batch_files (next_try_at);
