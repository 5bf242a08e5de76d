-- Every job event is announced on NOTIFY channel llmq_job_events with payload "<job id>:<seq>"
-- by a trigger, so that a transition can insert its event in the same statement as its update
-- (one round trip) instead of sending a separate pg_notify.
CREATE FUNCTION llmq_notify_event() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('llmq_job_events', NEW.job_id::text || ':' || NEW.seq::text);
    RETURN NULL;
END
$$;

CREATE TRIGGER job_events_notify AFTER INSERT ON job_events
    FOR EACH ROW EXECUTE FUNCTION llmq_notify_event();
