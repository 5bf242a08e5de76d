-- Jobs: the source of truth. A job exists once its row is committed.
CREATE TABLE jobs (
    id              uuid PRIMARY KEY,
    tenant          text        NOT NULL DEFAULT 'default',
    credential      text        NOT NULL,
    idempotency_key text,
    fingerprint     text        NOT NULL,
    status          text        NOT NULL CHECK (status IN ('queued', 'running', 'retrying', 'succeeded', 'failed', 'dead', 'canceled')),
    -- json, not jsonb: the request goes to the provider byte for byte as the client sent it.
    request         json        NOT NULL,
    attempts        integer     NOT NULL DEFAULT 0,
    max_attempts    integer     NOT NULL CHECK (max_attempts > 0),
    timeout_ms      bigint      NOT NULL CHECK (timeout_ms > 0),
    deadline        timestamptz NOT NULL,
    metadata        jsonb       NOT NULL DEFAULT '{}',
    result          json,
    usage           jsonb,
    last_error      jsonb,
    dead_reason     text,
    next_attempt_at timestamptz,
    -- Sequence number of the job's latest event; bumped by every transition under the row lock.
    event_seq       integer     NOT NULL DEFAULT 0,
    created_at      timestamptz NOT NULL DEFAULT now(),
    started_at      timestamptz,
    finished_at     timestamptz,
    updated_at      timestamptz NOT NULL DEFAULT now()
);

-- The sweeper and operators scan only the jobs that are not finished.
CREATE INDEX jobs_unfinished_idx ON jobs (id) WHERE status IN ('queued', 'running', 'retrying');
CREATE INDEX jobs_tenant_created_idx ON jobs (tenant, created_at);
CREATE INDEX jobs_dead_idx ON jobs (finished_at) WHERE status = 'dead';

-- Idempotency keys, scoped per tenant. One row per key; claimed in the same transaction that
-- inserts the job, so a key and its job commit (or vanish) together.
CREATE TABLE idempotency_keys (
    tenant      text        NOT NULL,
    key         text        NOT NULL,
    fingerprint text        NOT NULL,
    job_id      uuid        NOT NULL REFERENCES jobs (id) ON DELETE CASCADE DEFERRABLE INITIALLY DEFERRED,
    created_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant, key)
);

-- One row per provider call.
CREATE TABLE job_attempts (
    job_id         uuid        NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
    attempt        integer     NOT NULL,
    credential     text        NOT NULL,
    started_at     timestamptz NOT NULL,
    latency_ms     double precision NOT NULL,
    ttfb_ms        double precision,
    status_code    integer,
    class          text        NOT NULL,
    retry_after_ms bigint,
    delay_ms       bigint,
    error          text,
    PRIMARY KEY (job_id, attempt)
);

-- Every status transition, numbered per job; feeds SSE (via NOTIFY) and the audit trail.
CREATE TABLE job_events (
    job_id     uuid        NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
    seq        integer     NOT NULL,
    type       text        NOT NULL,
    payload    jsonb       NOT NULL DEFAULT '{}',
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (job_id, seq)
);
