ALTER TABLE jobs DROP COLUMN slot_grant;
