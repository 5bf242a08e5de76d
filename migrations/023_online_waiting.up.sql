-- The leading worker measures the online lane's backlog every 15 s (internal/backlog): how many
-- jobs wait for an attempt (queued, retrying) and since when the oldest has waited. From this
-- index alone (an index-only scan: count and min by status), never the rows: a backlog of a
-- million jobs is a million index entries read, not a million rows. A job waits since its
-- submission or, a dead letter retried, since its retry: deadline - timeout_ms, as both set
-- deadline = clock_timestamp() + timeout_ms (created_at would make a retry of jobs that died days
-- ago look days old). Its cost is one index entry more per transition to queued or retrying of an
-- online job (status is in other indexes' predicates and deadline in
-- jobs_unfinished_deadline_idx already, so those updates were no HOT updates before either;
-- timeout_ms never changes); the batch lane's jobs, which wait for their batch by design (up to a
-- day), are not in it.
CREATE INDEX jobs_online_waiting_idx ON jobs (status, deadline) INCLUDE (timeout_ms)
    WHERE status IN ('queued', 'retrying') AND lane = 'online';
