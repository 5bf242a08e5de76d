DROP INDEX jobs_dead_reason_idx;
