ALTER TABLE jobs DROP COLUMN batch_state, DROP COLUMN batch_id, DROP COLUMN batch_ref, DROP COLUMN lane;
DROP TABLE provider_batches;
