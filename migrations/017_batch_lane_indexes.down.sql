DROP INDEX jobs_batch_ref_idx;
DROP INDEX jobs_batch_waiting_idx;
