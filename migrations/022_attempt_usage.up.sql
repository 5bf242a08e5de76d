-- What the provider counted for each answered attempt (the answer's usage object, as jobs.usage
-- holds the stored answer's), also for an answer that came after its job ended (a cancel, the
-- deadline pass): the provider charged for it though no result was stored. NULL for an attempt
-- with no answer, and for those recorded by a process of the release before this one, which
-- does not name the column.
ALTER TABLE job_attempts ADD COLUMN usage jsonb;
