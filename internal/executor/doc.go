// Package executor runs one delivery of a job: the decision logic of a worker. A delivery reads
// top to bottom (Executor.process):
//
//	load    read the job; a terminal job needs nothing more (deliveries are at least once), but
//	        gives back a limiter slot its row still holds (canceled or failed while it waited)
//	share   a slot of the process in the tenant's share (Config.Slots): over it, the job is deferred
//	guard   another delivery's lease, the deadline, a credential no longer configured, a retry delay
//	breaker the credential's circuit breaker, shared by every worker: an open one defers the job
//	admit   the credential's shared limiter: pause, retry budget, a rate (and token) slot
//	begin   mark the job running and take the attempt's lease in Postgres
//	call    send the request to the provider, tell the limiter and breaker what it showed
//	record  classify the outcome and store it: succeeded, retrying (with a delay), failed or dead
//
// The breaker decides before the limiter, but on a first attempt its usual answer (closed, and
// warm) is read by the limiter's reservation script in the same round trip (see clear); an
// answer's bookkeeping with the limiter and the breaker runs beside its record (see attempt).
//
// Each step returns an error: nil to go on; errHandled when the delivery is complete; a
// *deferral when the job must come back later (Process hands it to dispatch as a
// *dispatch.DeferError); any other error when a store failed (dispatch retries the delivery).
//
// A job's outcome is stored once: every transition is a conditional update in Postgres (see
// internal/jobs), so a duplicate delivery cannot store a second result, and the attempt lease
// keeps two deliveries from calling the provider for one job at once.
package executor
