-- Tenant token rotation (ctl tenants rotate, the console). A rotation puts the new token's
-- SHA-256 in tenants.token_sha256, where processes of the release before this one look too (they
-- accept it at once), and moves the token it replaces here, with the end of its overlap: until
-- expires_at it authenticates as its tenant, after it answers 401 "rotated out" (rather than
-- "unknown"), for ever. A second rotation ends at once every token of the tenant here that has
-- not ended yet. Only SHA-256s are stored, as in tenants.
CREATE TABLE tenant_previous_tokens (
    token_sha256 bytea       PRIMARY KEY CHECK (octet_length(token_sha256) = 32),
    tenant       text        NOT NULL REFERENCES tenants (name),
    rotated_at   timestamptz NOT NULL,
    expires_at   timestamptz NOT NULL CHECK (expires_at >= rotated_at)
);
-- A rotation ends the tenant's tokens still in their overlap.
CREATE INDEX tenant_previous_tokens_tenant ON tenant_previous_tokens (tenant, expires_at);
