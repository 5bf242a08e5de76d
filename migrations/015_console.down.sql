DROP INDEX job_attempts_started_brin;
DROP INDEX jobs_created_idx;
DROP TABLE audit_log;
DROP TABLE operator_sessions;
DROP TABLE operators;
