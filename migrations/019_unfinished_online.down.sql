CREATE INDEX jobs_unfinished_idx ON jobs (id) WHERE status IN ('queued', 'running', 'retrying');
DROP INDEX jobs_unfinished_online_idx;
