-- Per-job overrides of the credential's attempt limits (NULL: the credential's own).
ALTER TABLE jobs ADD COLUMN attempt_timeout_ms bigint CHECK (attempt_timeout_ms > 0);
ALTER TABLE jobs ADD COLUMN first_byte_timeout_ms bigint CHECK (first_byte_timeout_ms > 0);
