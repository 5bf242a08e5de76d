package breaker

// The breaker's keys of a credential sit beside the limiter's, under the same prefix and hash tag
// (redisscript.CredentialTag), in the same Redis Cluster slot.

// breakerKey holds a credential's breaker (a hash; see allowScript for its fields). A closed
// breaker's key expires IdleTTL after its last write; no key means closed with no failures and
// no Success remembered (so, cold: see Config.SuccessMemory).
func breakerKey(prefix, tag string) string { return prefix + tag + ":cb" }

// leaseKey holds a credential's cold-start slots (a sorted set: lease id → deadline µs; see
// allowScript). It shares the breaker key's hash tag, so both are in one Redis Cluster slot.
func leaseKey(prefix, tag string) string { return prefix + tag + ":cb:lease" }
