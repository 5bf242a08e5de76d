-- A credential's pause (a spend cap: a 429 without Retry-After), kept here so that it survives
-- Redis losing its data (internal/credpause). Redis holds its fast copy, the limiter's pause hash,
-- which every admission reads; a copy Redis no longer has is written back from this row before
-- the credential's next attempt. The row is the pause episode: inserted by the first spend-cap
-- answer (the one that alerts), deleted by a resume (ctl credentials resume, the console, a
-- successful pause probe). tag is the credential's Redis tag (redisscript.CredentialTag, a hash of
-- its key): credentials sharing a key share a pause, as they do in Redis.
CREATE TABLE credential_pauses (
    tag          text        PRIMARY KEY,
    credential   text        NOT NULL,
    since        timestamptz NOT NULL,
    reason       text        NOT NULL,
    first_job_id text        NOT NULL DEFAULT ''
);
