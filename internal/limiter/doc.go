// Package limiter is llmq's admission control per provider key, shared by every worker process
// through Redis: a rate limiter that hands out send times, the limits it learns from responses,
// a retry budget, and the pause of a key that hit a spend cap.
//
// Why: a burst of 100 calls against a provider bucket of capacity 20 refilled at 10/s has a
// floor of 8.0 s. Retrying senders (backoff, jitter, even Retry-After) arrive in waves and
// waste hundreds of requests; a limiter shared by all senders reaches 8.0 s with 100 requests
// and no 429 (docs/benchmarks.md, herd). That only works if every process shares one schedule.
//
// # Scheduling
//
// Gate.Reserve runs one Lua script (GCRA: a theoretical arrival time tat per key) that
// returns when the request may be sent. A full bucket lets Burst requests go at once; after that
// one goes every 1/Rate, whichever process asks. Slots are times, not sleeps: a caller whose
// slot is far off can hand the job back to its scheduler and send at SendAt. All state lives in
// self-expiring keys under "<prefix>{<sha256 of the key>}:"; the raw key never reaches Redis.
// With Config.Now nil the scripts read Redis TIME, so processes never disagree about "now";
// Reservation.Wait is measured on that clock.
//
// # Margins (the provider's bucket and ours are never in phase)
//
// A request that reaches the provider a few milliseconds before its bucket refilled is a 429.
// Our schedule is exact on our clock, but the provider's refill starts when our first request
// lands, requests take different times to reach it (a cold TLS connection in a burst, a warm one
// after), and clocks differ. Two knobs cover this instead of tuning to one simulator:
//   - PhaseMargin (default 100 ms) delays every request that waits for a refill, and only those:
//     requests a full bucket holds go at once, since the provider's full bucket holds them too.
//     The schedule after the burst is shifted as a whole, so the cost is PhaseMargin once per
//     burst (1.25% of the 8 s floor), not per request. Holding back a burst token instead would
//     cost a whole 1/Rate (100 ms here) for the same protection, and none at higher rates.
//   - RateMargin (default 1%) spaces requests (1+RateMargin)/Rate apart, so a provider refilling
//     a little slower than advertised (or a learned rate a little high) cannot drift us into
//     429s over a long run. It costs 1% of the paced part (80 ms of the 8 s floor).
//
// Together: 8.18-8.26 s for the 100-request herd (1.02-1.03x the floor), measured in the
// simulation test with 1-5 ms and 1-60 ms of random network delay each way, and no 429.
//
// # Learning a limit (the zero Limit)
//
// Unknown: one probe goes out (Reservation.Probe); everybody else is told to ask again shortly
// (Granted false), at half the probe's age, within [PollInterval, 1s]. A probe unanswered for
// ProbeTTL is replaced. A burst of 100 never goes out blind.
//
// From each response (Gate.Observe; the caller reads Anthropic's
// anthropic-ratelimit-requests-* and OpenAI's x-ratelimit-*-requests):
//   - Burst = Limit. A new Limit value starts the rate estimate afresh.
//   - Rate bounds: the provider needs (Limit-Remaining) refills to be full at ResetAt, so
//     rate = deficit / (ResetAt - evaluation time). Remaining is rounded down (the deficit may
//     be one less), the request was evaluated between SentAt and At, a reset that is a whole
//     second is taken as truncated to the second, and an absolute reset (Anthropic's) is off by
//     the clocks' offset: as the responses' Date headers prove it (each bounds it to a second;
//     the process keeps their intersection per credential, which narrows to about a round
//     trip), or by up to ClockSkew (100 ms) for a response without a Date. Each response thus
//     proves an interval lo..hi; the limiter keeps the intersection (max lo, min hi), which
//     tightens as responses with different quantisation phases arrive. A response outside it means the provider changed its rate: the interval
//     restarts from that response.
//   - The rate paced at is lo, the most the evidence guarantees: never the midpoint or a median
//     of point estimates, which overshoot when the reset is coarse (a 2 s refill reported to the
//     second is +-50%).
//   - That costs little because of lending: the provider surely still holds Remaining less every
//     request we let out that may have reached it after this one (Observation.Seq tells which;
//     requests sent within PhaseMargin of each other count as unordered; unknown means all).
//     When that is more than our schedule holds, the surplus goes out at once. This closes the
//     loop whatever the estimate: pace below the provider and its bucket fills, Remaining rises,
//     and the surplus is used. Without it a low estimate would pace so slowly that the bucket
//     never drains, and responses would never carry the deficit needed to learn more (the
//     simulation found this: 0.25/s forever against a 10/s provider reporting "1s" resets).
//   - Learned slots are handed out at most LearnHorizon (250 ms) ahead, so a better estimate, a
//     provider change or a surplus applies to the queue at once. Callers further back are told
//     when to ask again, spread by their place in line and at least once a second (surplus is
//     lent only to those who ask). The price is about one Reserve per waiting job per second;
//     a credential with thousands of jobs queued for minutes should have its limit configured
//     (a configured limit takes one Reserve per attempt).
//   - A 429 with Retry-After: nobody sends before At+RetryAfter (the bucket is taken to hold one
//     request then), nothing is lent until a success, and the learned rate is capped 10% below
//     what was paced at, until the Limit changes or LearnTTL passes; the 429s of requests sent
//     before that cut (a burst refused together) do not cut it again. A ceiling rather than a
//     lower bound, which the next response would raise again when the error is systematic. The
//     push-back is capped at Config.MaxRetryAfter (5 minutes): every tenant and worker waits for
//     it, so one absurd header must not stall the credential for an hour. Gate.PushBack reports
//     it (until when, the hint asked and applied); Gate.ClearPushBack ends it.
//     A 429 that refused the request for its size (Observation.TooLarge: OpenAI's "Request too
//     large for … (TPM)") does none of this: it says nothing of the rate.
//   - Learned state expires LearnTTL (10 min) after the last response, so stale knowledge heals
//     by probing again. A provider that sends no headers is paced by Retry-After only: configure
//     its limit.
//
// The simulation test (100 jobs, capacity 20, 10/s) learns at 1.03-1.07x the floor with 100
// requests and no 429, with reset headers exact, truncated to seconds, as millisecond durations
// or as whole seconds rounded up; 1,000 jobs at 50/s over 8 processes at 1.01x; and follows a
// provider that raises or lowers its limit mid-run. With the provider's clock 300 ms or 1.5 s
// off ours, no 429 when its responses carry a Date (real ones do); 0-2 at 300 ms without one.
//
// # Token limits
//
// Providers also limit tokens per minute: Anthropic input and output tokens, OpenAI input and
// output together. Gate.ReserveCost takes a request's tokens.Cost (estimated input tokens, and
// max_tokens of output) from each known token bucket in the same Lua script as its request slot:
// GCRA on tokens, a bucket of N tokens per minute holding N at once and refilling N per
// Config.TokenMinute, a request of n tokens advancing the bucket's tat by n spacings. SendAt is
// the latest of the request bucket and the token buckets (a bucket that waits for a refill keeps
// the phase margin, and the rate margin spaces tokens too). A cost larger than a whole bucket is a
// *tokens.TooLargeError (nothing reserved): it can never be sent. Reserve, and a zero tokens.Cost, take no
// tokens at all: credentials used without costs behave exactly as before.
//
// Costs are estimates (internal/tokens): after the answer, Gate.Reconcile trues the grant up
// to the usage the provider reported, so our buckets track the provider's count, as Anthropic's
// own output limit does (max_tokens charged up front, adjusted at the end). A charge moves later
// send times later by exactly the difference. A refund moves them earlier, but a slot already
// handed out keeps its tokens: GCRA gives tat = max over grants j of (its model time + the tokens
// from j on), so a refund to grant X only lowers tat to the same maximum over the grants after X
// (kept, bounded, per bucket). Because refunds matter only for slots not yet handed out, a slot
// the tokens push beyond Config.TokenHorizon (1 s) is handed out only while no other such slot is
// pending; the others are told to ask again within a second. A single tat cannot represent room
// before a slot handed out far ahead, so the request bucket (and the tokens of other requests)
// count such a slot from its send time: conservative, never early.
//
// Learned token limits: each response's token headers (Observation.InputTokens, OutputTokens,
// Tokens) give the capacity (Limit) and bound the refill rate like the request limit does; the
// rate paced at is at least Limit per TokenMinute. Unless a bucket is configured, the schedule is
// never let below what the provider surely held: Limit - Remaining (less its rounding: Anthropic
// rounds to the thousand) from the request's send on. There is no lending for tokens.
//
// The simulation test (the tokens benchmark's shape: 100 jobs of 2,000 input tokens and max_tokens 200 against
// 50 requests/s, 40,000 input and 8,000 output tokens per minute with a 6 s minute, 500 ms
// answers, the first wave over-estimated by 25%) finishes at 1.04x the 24 s token floor with known
// limits and with learned ones (TokenMinute matching), 100 requests and no 429; with the limiter's
// minute not the provider's, from the headers alone, 1.19x. Counting requests only, the same run
// draws hundreds of 429s.
//
// # Fair queueing (AttemptOptions.Lane)
//
// An attempt that names its Lane (tenant, the tenant's weight, priority; its job's ID as ticket)
// is queued fairly in the same script: each lane (tenant × priority) with waiting tickets has a
// virtual finish time F, its n-th ticket is due at F + n/w, and a tenant's weight is split
// between its waiting priorities (each lower one keeps Fairness.MinShareNormal/MinShareLow of it,
// the highest the rest). Slots go out at most Fairness.Horizon (150 ms) ahead, to the asks whose
// turn falls among the free slots of the horizon; the others reserve nothing and are told to come
// back about when their turn comes (Granted false). Tickets are ordered by Lane.Since, so a ticket
// lost with Redis takes the same place when its job asks again. Equal tenants get 50/50, weights
// 2:1 get 67/33, and an interactive job under a 3,000-job flood waits under 0.3 s (fair_test.go).
// A lane that stops waiting starts again no earlier than the virtual finish time it left with
// (no credit for idling, no escape from what its last grants took), and the tokens an ask in its
// turn waits for are not granted to the turns after it (fair_hostile_test.go).
//
// # Retry budget
//
// Gate.RecordAttempt counts first attempts; Gate.AllowRetry atomically grants and
// counts a retry while granted retries in the sliding window (default 60 s, in 12 buckets) stay
// within Floor + Ratio × first attempts (defaults 10 and 10%). A refusal means the caller defers
// the retry. llmq_retry_budget_refusals_total counts the retries refused: a retry named by its
// caller (the executor names it by job and attempt) that is asked for again while the budget
// stays spent, by any process, counts once (the names refused within the last window are kept in
// Redis, refusedKey). A named retry draws once a window: asked for again (a call sent again after
// its reply was lost, a delivery back before its send), its grant is granted again, uncounted.
// Gate.RetryAllowed looks without counting, for a retry in a fair-queueing
// lane that draws only once its slot is granted: its refusal is the same one refusal, and takes
// the retry's ticket out of its lane, so that a refused retry holds no newer job of its tenant
// back.
//
// # Pause
//
// A 429 without Retry-After is a spend cap: Gate.Pause stops the key for every process
// until Gate.Resume, and tells exactly one caller per episode that it started it (the one
// that alerts). Gate.TryProbe lets one caller per interval send an automatic probe. A resumed key
// keeps a "not paused" mark, so that a Redis that lost the pause (PauseState.Unknown,
// Reservation.PauseUnknown with AttemptOptions.PauseDurable) can be told from one never paused;
// Gate.RestorePause writes back the state kept in Postgres (internal/credpause). A probe that is
// not sent is given back (Gate.ReleaseProbe): the next may go at once. One held for later with a
// job's slot (Gate.HoldProbe) goes with that slot (Gate.ReclaimProbe), or back with it when the
// job ends or leaves the credential unsent (Gate.ReleaseHeldProbe).
//
// # One round trip per attempt
//
// Gate.ReserveAttempt (and AcquireAttempt) is ReserveCost that also checks the pause
// (AttemptOptions.UnlessPaused: a paused key is refused, Reservation.Paused, before anything is
// reserved) and counts a first attempt when the slot is granted (AttemptOptions.FirstAttempt, as
// RecordAttempt would), in the same script: the worker's admission of a first attempt is one
// Redis round trip instead of three.
//
// # Metrics
//
// NewMetrics registers, labelled by credential name only: llmq_limiter_limit_requests_per_second,
// llmq_limiter_limit_burst_requests, llmq_limiter_limit_source{source}, llmq_limiter_wait_seconds,
// llmq_limiter_probes_total, llmq_limiter_retry_after_pushbacks_total,
// llmq_retry_budget_refusals_total and llmq_limiter_paused; for token limits
// llmq_limiter_limit_tokens_per_minute{bucket}, and the pair llmq_limiter_tokens_reserved_total
// and llmq_limiter_tokens_reported_total{kind="input"|"output"} (reserved at grant, reported at
// Reconcile, for grants that charged a bucket).
package limiter
