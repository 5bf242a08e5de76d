-- Fair share of a credential (docs/decisions.md): a job's priority orders its tenant's waiting
-- work; a tenant's weight is its share of a credential against the other tenants with work.
-- Both columns have a constant default, so adding them rewrites no row. The checks are added
-- NOT VALID: every existing row holds the default, and validating would read the whole table
-- under lock; new and updated rows are checked all the same.
ALTER TABLE jobs ADD COLUMN priority text NOT NULL DEFAULT 'normal';
ALTER TABLE jobs ADD CONSTRAINT jobs_priority_check CHECK (priority IN ('high', 'normal', 'low')) NOT VALID;

ALTER TABLE tenants ADD COLUMN weight integer NOT NULL DEFAULT 1;
ALTER TABLE tenants ADD CONSTRAINT tenants_weight_check CHECK (weight BETWEEN 1 AND 1000) NOT VALID;
