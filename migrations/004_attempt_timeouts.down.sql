ALTER TABLE jobs DROP COLUMN first_byte_timeout_ms;
ALTER TABLE jobs DROP COLUMN attempt_timeout_ms;
