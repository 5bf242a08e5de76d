-- Failover: a job may name fallback credentials (same provider kind). credential_index says
-- which of [credential] + fallbacks the next attempt uses; answered_by records which one
-- produced the stored result.
ALTER TABLE jobs ADD COLUMN fallbacks text[] NOT NULL DEFAULT '{}';
ALTER TABLE jobs ADD COLUMN credential_index integer NOT NULL DEFAULT 0 CHECK (credential_index >= 0);
ALTER TABLE jobs ADD COLUMN answered_by text;
