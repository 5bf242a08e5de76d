// Package breaker is llmq's circuit breaker per provider key, shared by every worker process
// through Redis.
//
// Why: when a provider is down, every job retrying on its own turns a 30 s outage into minutes
// of wasted requests, and a breaker whose half-open state lets every waiting call through sends
// the whole herd at a provider that may still be down (docs/benchmarks.md, outage). So:
//
//   - Closed: every request goes (but see the cold-start cap below). Threshold (default 5)
//     consecutive server-side failures (5xx, 529, timeouts, connection errors) reported by any
//     process open the breaker. A Success resets the count; a Neutral outcome (4xx, 429 with
//     Retry-After, not sent) neither counts nor resets it.
//   - Open: every Allow is refused with RetryAt = the end of the cooldown: Cooldown (default
//     2 s) when it opened from closed, longer after failed probes (see backoff below). The
//     caller defers the job without counting an attempt and without sending anything.
//   - Half-open: the first Allow after the cooldown, in whichever process, is the probe; all
//     others are refused with RetryAt = now + Recheck (default 1 s) until the probe reports.
//     Its Success closes the breaker, clears the count and resets the cooldown; its Failure
//     re-opens it; its Neutral hands the probe to the next caller. A probe that never reports
//     (its process died) is replaced after ProbeTimeout (default 2 m).
//
// # Cold-start cap: opening costs exactly Threshold requests
//
// Counting reported failures is not enough under a burst: 200 jobs arriving at a closed
// breaker are all admitted before the first failure comes back, so a provider that is already
// down gets far more than Threshold requests before the breaker opens. So a closed breaker that
// has recorded no Success within SuccessMemory (default 1 m) — a new credential, one idle for a
// while, or one whose answers since have all been failures — admits only Threshold − (failures
// counted) requests whose outcome is not yet reported (at least one); the others are refused
// with Admission.Capped and RetryAt = now + Recheck (or when the first slot's lease ends, if
// sooner). Each admission holds its slot until it reports (any outcome frees it; a Failure also
// counts, so the room never grows back before the breaker opens) or until ProbeTimeout passes
// (its caller crashed). The first Success lifts the cap: the breaker is warm, and admits
// everyone without writing anything, as before. A provider already down thus costs exactly
// Threshold requests, however many callers arrive at once.
//
// The price is paid on a cold credential whose provider is fine: everyone but the first
// Threshold callers waits for the first Success, one round trip of the provider rounded up to
// the next Recheck (1 s by default; for a 30 s generation, ~30 s, unless it streams: llmq's
// executor reports a streamed answer's 2xx headers as the Success of a start slot, see
// Admission.ColdStart, and a failure later as a Failure). Refused callers re-ask every
// Recheck meanwhile (one read-write script call each). The cap comes back after SuccessMemory
// without a Success; a warm breaker records a Success at most once per SuccessMemory/16 (so that
// a healthy credential's Reports stay read-only), so it can come back up to that much early.
// Set SuccessMemory negative to turn the cap off. A capped refusal says "not yet known to be
// up", not "down": callers should wait on the same credential, not fail over.
//
// # Cooldown backoff: few probes, recovery seen within MaxCooldown
//
// Each consecutive failed probe multiplies the cooldown by CooldownFactor (default 1.4), up to
// MaxCooldown (default 30 s); a successful probe resets it. Neither a Neutral probe nor a probe
// replaced after ProbeTimeout counts as failed. With the defaults (Cooldown 2 s) the open periods
// are 2, 2.8, 3.9, 5.5, 7.7, 10.8, 15.1, 21.1 and then 30 s: a short outage is seen within
// seconds of its end, and once the cooldown has reached its cap (after about a minute) a long
// outage costs two probes a minute. A provider that recovers right after a failed probe is
// found by the next one, at most the cooldown then in force later (plus the round trips of the
// two probes): MaxCooldown bounds that detection delay. Example (the outage benchmark with
// nothing configured: threshold 5, a 20 s outage under a 200-job burst): the cold-start cap lets
// 5 requests out, they open the breaker, probes go at about 2, 5, 9 and 14 s, 9 provider
// requests in all; the next, at about 22 s, sees the recovery.
//
// Each transition and each probe granted bumps a generation that Admission carries, so Report
// ignores an outcome whose state has ended: requests in flight when the breaker opened cannot
// re-open it or extend its cooldown, and a replaced probe that answers late cannot close it.
//
// # State in Redis
//
// One hash per key, "<prefix>{<sha256 of the key>}:cb", in the limiter's Redis Cluster slot; the
// raw key never reaches Redis; beside it, while cold-start slots are out, a sorted set
// "<prefix>{<sha256>}:cb:lease" (lease id → deadline), in the same slot. Allow and Report are
// one Lua script each, so reading the state and changing it are atomic across processes: that
// is what makes the probe single and the cold-start cap exact. With Config.Now nil the scripts
// read Redis TIME, so processes never disagree about a cooldown or a lease. A closed breaker's
// key expires IdleTTL (10 m) after its last write (at least SuccessMemory, and ProbeTimeout
// while slots are out), and a warm closed breaker with no failures writes nothing: Allow on a
// healthy credential is one read-only script call, and its Successes write once per
// SuccessMemory/16 at most.
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
// llmq_breaker_rejected_total{credential} (every refusal: open, probe out, or cold-start cap).
package breaker
