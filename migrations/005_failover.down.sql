ALTER TABLE jobs DROP COLUMN answered_by;
ALTER TABLE jobs DROP COLUMN credential_index;
ALTER TABLE jobs DROP COLUMN fallbacks;
