ALTER TABLE jobs DROP COLUMN lease_token, DROP COLUMN lease_until;
