// Package jobs is the job model and its Postgres store: the source of truth. A job exists once
// its row is committed; every transition (queued → running → succeeded | failed | dead |
// canceled, with running → retrying → running between attempts) is one conditional statement
// committed with its event, so a duplicate delivery can never store a second result.
//
// The store holds the jobs, their attempts and events, and the idempotency keys (one job per key
// and tenant); the attempt lease (BeginAttempt, RenewLease) that keeps one call in flight per
// job; the group-commit batcher that lets concurrent transitions share a transaction; the
// Listener that turns Postgres NOTIFY into signals for event streams; the operators' queries
// (List, PageDead, RetryDead, PurgeDead, Stats); and the maintenance passes' statements
// (FailOverdue, DeleteFinished). It depends on pgx and nothing of Redis: what dispatches jobs is
// internal/dispatch, what runs them is internal/executor, what maintains them is
// internal/maintenance.
package jobs
