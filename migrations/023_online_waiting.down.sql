DROP INDEX IF EXISTS jobs_online_waiting_idx;
