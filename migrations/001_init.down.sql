DROP TABLE job_events;
DROP TABLE job_attempts;
DROP TABLE idempotency_keys;
DROP TABLE jobs;
