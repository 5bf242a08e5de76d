DROP TRIGGER job_events_notify ON job_events;
DROP FUNCTION llmq_notify_event();
