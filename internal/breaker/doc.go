// Package breaker is llmq's circuit breaker per provider key, shared by every worker process
// through Redis.
//
// Why: when a provider is down, every job retrying on its own turns a 30 s outage into minutes
// of wasted requests, and a breaker whose half-open state lets every waiting call through sends
// the whole herd at a provider that may still be down (../shared/seeds/000_*, 002_*). So:
//
//   - Closed: every request goes. Threshold (default 5) consecutive server-side failures (5xx,
//     529, timeouts, connection errors) reported by any process open the breaker. A Success
//     resets the count; a Neutral outcome (4xx, 429 with Retry-After, not sent) neither counts
//     nor resets it.
//   - Open: every Allow is refused with RetryAt = the end of the Cooldown (default 30 s). The
//     caller defers the job without counting an attempt and without sending anything.
//   - Half-open: the first Allow after the cooldown, in whichever process, is the probe; all
//     others are refused with RetryAt = now + Recheck (default 1 s) until the probe reports.
//     Its Success closes the breaker and clears the count; its Failure re-opens it for a fresh
//     cooldown; its Neutral hands the probe to the next caller. A probe that never reports
//     (its process died) is replaced after ProbeTimeout (default 2 m).
//
// Each transition and each probe granted bumps a generation that Admission carries, so Report
// ignores an outcome whose state has ended: requests in flight when the breaker opened cannot
// re-open it or extend its cooldown, and a replaced probe that answers late cannot close it.
//
// # State in Redis
//
// One hash per key, "<prefix>{<sha256 of the key>}:cb", in the limiter's Redis Cluster slot; the
// raw key never reaches Redis. Allow and Report are one Lua script each, so reading the state
// and changing it are atomic across processes: that is what makes the probe single. With
// Config.Now nil the scripts read Redis TIME, so processes never disagree about a cooldown. A
// closed breaker's key expires IdleTTL (10 m) after its last write, and a closed breaker with no
// failures writes nothing: Allow on a healthy credential is one read-only script call.
//
// # Why not sony/gobreaker v2's DistributedCircuitBreaker
//
// Read at v2.4.0 (distributed_gobreaker.go). Execute reads the shared state before it takes the
// store's lock, then injects that snapshot into its in-memory breaker and writes it back: two
// processes that both read "open, cooldown over" each become the probe, so half-open is not
// exactly one probe. It also holds the lock for the whole request (every call of a credential
// across the cluster serialised; an LLM call takes seconds to minutes), retries the lock with
// time.Sleep(500ms) for up to 5 s on the local clock with no context, offers no two-step
// Allow/report in distributed mode, and its open error carries no time to come back, which the
// worker needs to defer a job. We would also have had to write its Lock/Unlock store. Two short
// Lua scripts are simpler and correct.
//
// # Metrics
//
// NewMetrics registers llmq_breaker_state{credential,state} (1 for the state this process last
// saw), llmq_breaker_transitions_total{credential,to} (counted by the process whose call made
// the transition, so the sum over processes counts each once) and
// llmq_breaker_rejected_total{credential}.
package breaker
