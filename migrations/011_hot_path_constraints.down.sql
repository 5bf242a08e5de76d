CREATE FUNCTION llmq_number_attempt() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.attempt := NEW.attempt + coalesce((SELECT attempt_base FROM jobs WHERE id = NEW.job_id), 0);
    RETURN NEW;
END
$$;
CREATE TRIGGER job_attempts_number BEFORE INSERT ON job_attempts
    FOR EACH ROW EXECUTE FUNCTION llmq_number_attempt();
DELETE FROM job_events e WHERE NOT EXISTS (SELECT 1 FROM jobs WHERE id = e.job_id);
DELETE FROM job_attempts a WHERE NOT EXISTS (SELECT 1 FROM jobs WHERE id = a.job_id);
ALTER TABLE job_events ADD CONSTRAINT job_events_job_id_fkey FOREIGN KEY (job_id) REFERENCES jobs (id) ON DELETE CASCADE;
ALTER TABLE job_attempts ADD CONSTRAINT job_attempts_job_id_fkey FOREIGN KEY (job_id) REFERENCES jobs (id) ON DELETE CASCADE;
