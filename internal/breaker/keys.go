package breaker

import (
	"crypto/sha256"
	"encoding/hex"
)

// DefaultPrefix is the key prefix used when Config.Prefix is empty. It is the limiter's prefix:
// a credential's breaker key sits beside its limiter keys, in the same Redis Cluster slot.
const DefaultPrefix = "llmq:"

// credentialTag is the Redis hash tag of a provider key: "{<sha256 hex of id>}", the same tag
// internal/limiter uses. The raw id never reaches Redis.
func credentialTag(id string) string {
	sum := sha256.Sum256([]byte(id))
	return "{" + hex.EncodeToString(sum[:]) + "}"
}

// breakerKey holds a credential's breaker (a hash; see allowScript for its fields). A closed
// breaker's key expires IdleTTL after its last write; no key means closed with no failures and
// no Success remembered (so, cold: see Config.SuccessMemory).
func breakerKey(prefix, tag string) string { return prefix + tag + ":cb" }

// leaseKey holds a credential's cold-start slots (a sorted set: lease id → deadline µs; see
// allowScript). It shares the breaker key's hash tag, so both are in one Redis Cluster slot.
func leaseKey(prefix, tag string) string { return prefix + tag + ":cb:lease" }
