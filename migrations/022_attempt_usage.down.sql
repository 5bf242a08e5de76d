ALTER TABLE job_attempts DROP COLUMN usage;
