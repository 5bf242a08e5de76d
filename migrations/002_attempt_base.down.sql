DROP TRIGGER job_attempts_number ON job_attempts;
DROP FUNCTION llmq_number_attempt();
ALTER TABLE jobs DROP COLUMN attempt_base;
