-- An operator's `ctl dead retry` puts a dead job back to `queued` with `attempts` reset to 0 (a
-- fresh attempt budget), while keeping its old attempts in job_attempts. The worker numbers an
-- attempt by jobs.attempts, and job_attempts' key is (job_id, attempt), so without an offset the
-- new round's attempt 1 would collide with the old attempt 1 (and be dropped by the insert's
-- ON CONFLICT DO NOTHING). attempt_base is the number of attempts recorded before the latest
-- retry; a trigger adds it to every inserted attempt, so the new round continues the numbering
-- (old 1..5, new 6, 7, ...) and a duplicate delivery of one attempt still collides as it should.
ALTER TABLE jobs ADD COLUMN attempt_base integer NOT NULL DEFAULT 0 CHECK (attempt_base >= 0);

CREATE FUNCTION llmq_number_attempt() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.attempt := NEW.attempt + coalesce((SELECT attempt_base FROM jobs WHERE id = NEW.job_id), 0);
    RETURN NEW;
END
$$;

CREATE TRIGGER job_attempts_number BEFORE INSERT ON job_attempts
    FOR EACH ROW EXECUTE FUNCTION llmq_number_attempt();
