-- NOTIFY serializes commits: a transaction that notifies takes a database-wide lock at commit and
-- holds it through its WAL flush, so announcing every transition capped the whole queue at one
-- commit at a time (the throughput profile showed backends waiting on Lock:object). Only the
-- transitions someone follows need announcing: an event stream (SSE) watches its job here,
-- refreshing expires_at while it is open, and the trigger notifies only for watched jobs.
CREATE TABLE job_watches (
    job_id     uuid        PRIMARY KEY REFERENCES jobs (id) ON DELETE CASCADE,
    expires_at timestamptz NOT NULL
);

CREATE OR REPLACE FUNCTION llmq_notify_event() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM job_watches WHERE job_id = NEW.job_id AND expires_at > now()) THEN
        PERFORM pg_notify('llmq_job_events', NEW.job_id::text || ':' || NEW.seq::text);
    END IF;
    RETURN NULL;
END
$$;
