package limiter

// The limiter's keys of a credential: prefix + redisscript.CredentialTag(id) + a suffix.

// rateKey holds the admission schedule and what was learned about the provider's limit (a hash;
// see reserveScript for its fields). It expires LearnTTL after the schedule's last reservation.
func rateKey(prefix, tag string) string { return prefix + tag + ":rl" }

// budgetKey holds the retry budget's per-bucket counters (a hash). It expires one window after the
// last attempt.
func budgetKey(prefix, tag string) string { return prefix + tag + ":budget" }

// pauseKey holds the pause episode of a credential (a hash). It has no TTL: only Resume ends a
// pause.
func pauseKey(prefix, tag string) string { return prefix + tag + ":pause" }

// tokenKey holds the credential's token buckets and what was learned about them (a hash; see
// luaTokens). It expires LearnTTL after its buckets are full again.
func tokenKey(prefix, tag string) string { return prefix + tag + ":tk" }

// grantKey holds the token grants not yet reconciled (a hash: grant id → tokens charged per
// bucket), at most the most recent grantsKept. It expires with tokenKey.
func grantKey(prefix, tag string) string { return prefix + tag + ":tkg" }
