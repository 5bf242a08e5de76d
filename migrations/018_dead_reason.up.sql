-- The dead letters by reason. The console's overview counts the dead jobs by reason every 2 s
-- while one is open (DeadByReason); through jobs_finished_idx that read every dead job's row
-- (250 ms to 1.7 s for 20,000 dead jobs among a million, each row on a page of its own), and
-- dead jobs are kept until purged. This index answers the count from the index alone (3 ms), and
-- serves the dead-letter list and retry by reason (ctl dead list/retry --reason, the console's
-- filter) newest first. Partial: only a transition to dead writes it.
CREATE INDEX jobs_dead_reason_idx ON jobs (dead_reason, finished_at) WHERE status = 'dead';
