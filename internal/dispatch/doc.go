// Package dispatch is everything that knows asynq: the task of a job and its enqueue, the Redis
// client construction asynq and the shared state use, the server that delivers tasks to a
// worker's Processor (deferrals, retries of deliveries that failed on the stores), aborting and
// requeueing tasks for the API and operators, and the sweeper that keeps Redis in step with
// Postgres.
//
// Postgres is the source of truth (internal/jobs); Redis only dispatches. Each job is one asynq
// task, on its priority's queue (low jobs have their own, see Queues), whose TaskID is the job
// ID, so a second enqueue is a no-op and the sweeper's re-enqueue of a job whose task Redis lost
// races safely with the API's. The sweeper is the only code that reads asynq's private keys (a
// page of task states in one pipelined round trip, and the active list of the live servers); it
// is pinned to asynq v0.26's key layout and tested against it.
package dispatch
