// Package dispatch is everything that knows asynq: the task of a job and its enqueue, the Redis
// client construction asynq and the shared state use, the server that delivers tasks to a
// worker's Processor (deferrals, retries of deliveries that failed on the stores), aborting and
// requeueing tasks for the API and operators, and the sweeper that keeps Redis in step with
// Postgres.
//
// Postgres is the source of truth (internal/jobs); Redis only dispatches. Each job is one asynq
// task, on its priority's queue (low jobs have their own, see Queues), whose TaskID is the job
// ID, so a second enqueue is a no-op and the sweeper's re-enqueue of a job whose task Redis lost
// races safely with the API's (a low job's deferral waits as its due task, "<job>:due", and a job
// stuck on a dead worker gets a rescue task, "<job>:rescue"). Three parts use asynq's private
// keys: the sweeper reads them (a page of task states in one pipelined round trip, and the
// active list of the live servers); the wake hook (wake.go) knows asynq's scripts by their keys,
// and its batch dequeue (prefetch.go) runs a copy of asynq's dequeue on them; a Handoff listens
// on asynq's cancelation channel. All are pinned to asynq v0.26 and tested against it.
package dispatch
