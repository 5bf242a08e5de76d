-- A job whose limiter slot lies further ahead than a worker should sleep is handed back to asynq
-- with its slot: next_attempt_at is then the slot's send time and slot_seq its limiter sequence
-- number, so the next delivery sends at that time without reserving a second slot.
ALTER TABLE jobs ADD COLUMN slot_seq bigint;
