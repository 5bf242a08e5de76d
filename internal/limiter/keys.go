package limiter

// The limiter's keys of a credential: prefix + redisscript.CredentialTag(id) + a suffix.

// rateKey holds the admission schedule and what was learned about the provider's limit (a hash;
// see reserveScript for its fields). It expires LearnTTL after the schedule's last reservation.
func rateKey(prefix, tag string) string { return prefix + tag + ":rl" }

// The rate hash's name, ":call:" and a call's id holds a granted probe's reply (cmsgpack), or
// that of the last slot lent while the rate is unknown, or what a burst slot's send report that
// counted moved the schedule by (µs), for redisscript.CallKeep: the client sends a call again
// when its reply was lost with the connection (go-redis retries on a connection error, after
// Redis may have run the script), and the retry must get the grant, not find it out, and must not
// count a send twice (see reserveScript and sentScript, which name the key).

// budgetKey holds the retry budget's per-bucket counters (a hash). It expires one window after the
// last attempt.
func budgetKey(prefix, tag string) string { return prefix + tag + ":budget" }

// refusedKey holds the retries the budget refused lately (a sorted set: a retry's name → µs of
// its last refusal; see budgetScript), so that a retry asked for again while the budget is spent
// is counted refused once. Members go one window after their last refusal, and the key one window
// after the last refusal.
func refusedKey(prefix, tag string) string { return budgetKey(prefix, tag) + ":refused" }

// The budget hash's name and ":granted" holds the retries the budget granted lately (a sorted
// set: a retry's name → µs of its grant), so that a retry drawn again within the window (a draw
// go-redis sends again after its reply was lost, a delivery back for the same retry) draws once;
// members go one window after their grant, and the key one window after the last. The budget
// hash's name, ":call:" and a call's id holds the reply of a draw or look that counted a refusal,
// for redisscript.CallKeep, so that the call sent again tells it too (see budgetScript, which
// names both keys).

// pauseKey holds the pause episode of a credential (a hash; missing while not paused, as the
// last release's binaries expect, which pause only when it does not exist and resume by deleting
// it). It has no TTL: only Resume ends a pause.
func pauseKey(prefix, tag string) string { return prefix + tag + ":pause" }

// pauseKnownKey says that Redis holds the credential's pause state (a string: the since µs of
// the last episode a pause or restore wrote, or "1" from a resume or a restore of "not paused";
// the last release wrote "1" alone): written by every Pause, Resume and RestorePause and never
// deleted, so that a pause hash missing beside it means "not paused", and both missing a state
// Redis lost or never had (see Gate.RestorePause). Its value tells an episode that a resume in
// Redis alone ended (it names the episode) from one Redis lost in a failover (it names an
// earlier one: see Gate.RestoreLostPause). It is the pause hash's name and ":known" (the scripts
// given the one find the other); it has no TTL.
func pauseKnownKey(prefix, tag string) string { return pauseKey(prefix, tag) + ":known" }

// tokenKey holds the credential's token buckets and what was learned about them (a hash; see
// luaTokens). It expires LearnTTL after its buckets are full again.
func tokenKey(prefix, tag string) string { return prefix + tag + ":tk" }

// grantKey holds the token grants not yet reconciled (a hash: grant id → tokens charged per
// bucket), at most the most recent grantsKept: each id of the token hash's counter (a grant's, or
// a push's in observeTokensScript) drops the record grantsKept ids back. It expires with tokenKey.
func grantKey(prefix, tag string) string { return prefix + tag + ":tkg" }

// fairKey holds the fair queueing's virtual times and tenant weights (a hash; see luaFair),
// fairLanesKey the set of lanes with waiting tickets, fairDeadlineKey when each ticket is dropped
// unless asked for again (a sorted set), and fairLaneKey + lane name each lane's tickets in order
// (a sorted set). All expire after twice Fairness.MaxRecheck + TicketGrace (plus a minute) without
// an ask; losing them loses no job, only places in line until the tickets are asked for again.
// The fair hash's name and "b" (":fqb", named by the script) holds the virtual finish times of
// lanes that stopped waiting lately (a sorted set, lane → F; see fdebt in luaFair): a lane that
// waits again starts there, not at the others' virtual time. Entries go once the others have
// passed them; the key expires as the others do, counted from the last lane to stop waiting.
func fairKey(prefix, tag string) string         { return prefix + tag + ":fq" }
func fairLanesKey(prefix, tag string) string    { return prefix + tag + ":fql" }
func fairDeadlineKey(prefix, tag string) string { return prefix + tag + ":fqd" }
func fairLaneKey(prefix, tag string) string     { return prefix + tag + ":fq:" }
