-- Tenants: who may call the API, each with one bearer token. The token is shown once, when the
-- tenant is created (ctl tenants create); only its SHA-256 is stored, so neither a dump of this
-- table nor a reader of the database can authenticate as anyone. A revoked tenant keeps its row
-- (and its jobs) so that its token answers 403, not 401, and its name is not reused by accident.
CREATE TABLE tenants (
    name         text        PRIMARY KEY CHECK (name ~ '^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$'),
    token_sha256 bytea       NOT NULL UNIQUE CHECK (octet_length(token_sha256) = 32),
    -- NULL: every configured credential. Otherwise the only credentials (primary and fallbacks)
    -- the tenant's jobs may name.
    credentials  text[],
    created_at   timestamptz NOT NULL DEFAULT now(),
    revoked_at   timestamptz
);
