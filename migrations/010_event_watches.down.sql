CREATE OR REPLACE FUNCTION llmq_notify_event() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('llmq_job_events', NEW.job_id::text || ':' || NEW.seq::text);
    RETURN NULL;
END
$$;
DROP TABLE job_watches;
