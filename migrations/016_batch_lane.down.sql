DROP INDEX jobs_batch_ref_idx;
DROP INDEX jobs_batch_waiting_idx;
ALTER TABLE jobs DROP COLUMN batch_state, DROP COLUMN batch_id, DROP COLUMN batch_ref, DROP COLUMN lane;
DROP TABLE provider_batches;
