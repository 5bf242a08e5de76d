-- The sweeper walks the unfinished jobs of the online lane in ID order (ListUnfinished); the
-- batch lane's are the batcher's, and the walk leaves them out. Through jobs_unfinished_idx it
-- read them to leave them out: a batch-lane job waits in queued or running for its batch, up to
-- a day, in the hundreds of thousands, so every pass (every 10 s) read the batch backlog row by
-- row. A pass of 5,000 online jobs beside 220,000 batch-lane ones read 115,000 rows (60 to
-- 350 ms); through this index, 5,000 (2.5 to 18 ms). It holds only the online lane's unfinished
-- jobs and replaces jobs_unfinished_idx, which nothing else reads (a count of the unfinished jobs
-- has jobs_unfinished_deadline_idx): no index more per transition. lane is in the predicate of
-- jobs_batch_waiting_idx already, so a change of lane was no HOT update before either.
CREATE INDEX jobs_unfinished_online_idx ON jobs (id)
    WHERE status IN ('queued', 'running', 'retrying') AND lane = 'online';
DROP INDEX jobs_unfinished_idx;
