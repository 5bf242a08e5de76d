-- The operators' web console (/console/, internal/console).
--
-- Operators are not tenants: an operator sees and acts on every tenant's jobs. Like a tenant's,
-- an operator's token is shown once (ctl operators create) and only its SHA-256 is stored. A
-- revoked operator keeps its row, so that its name stays in the audit log unambiguous.
CREATE TABLE operators (
    name         text        PRIMARY KEY CHECK (name ~ '^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$'),
    token_sha256 bytea       NOT NULL UNIQUE CHECK (octet_length(token_sha256) = 32),
    created_at   timestamptz NOT NULL DEFAULT now(),
    revoked_at   timestamptz
);

-- A console login: the cookie holds a random session token, this table only its SHA-256. The
-- CSRF token is sent back by the page in a header with every action (synchronizer token). A
-- revoked operator's sessions are deleted with the revocation.
CREATE TABLE operator_sessions (
    token_sha256 bytea       PRIMARY KEY CHECK (octet_length(token_sha256) = 32),
    operator     text        NOT NULL REFERENCES operators (name) ON DELETE CASCADE,
    csrf_token   text        NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    expires_at   timestamptz NOT NULL
);
CREATE INDEX operator_sessions_expires_idx ON operator_sessions (expires_at);

-- Every operator action (console or ctl): who, what, on what, how many, when. Append-only.
CREATE TABLE audit_log (
    id       bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at       timestamptz NOT NULL DEFAULT now(),
    operator text        NOT NULL,
    action   text        NOT NULL,
    target   text        NOT NULL DEFAULT '',
    count    integer     NOT NULL DEFAULT 0,
    detail   jsonb
);

-- The console's job list: every tenant's jobs, newest first, paged by the cursor
-- (created_at, id) < (last row). The only other index by time leads with tenant.
CREATE INDEX jobs_created_idx ON jobs (created_at, id);

-- ctl stats and the console's overview (every 2 s while one is open) count the attempts started
-- in the last hour: without an index that reads the whole attempts table (337 ms on a million
-- rows). A BRIN index: attempts are appended in about the order they start, so block ranges
-- summarise well; it is a few kB for millions of rows and costs the hot insert path next to
-- nothing, where a B-tree would add a tree insert to every attempt (migration 011). A range is
-- summarised by (auto)vacuum, which autosummarize asks for as soon as the range is full; until
-- then it matches every query, so with autovacuum off the index helps only after a VACUUM.
CREATE INDEX job_attempts_started_brin ON job_attempts USING brin (started_at) WITH (autosummarize = on);
