package limiter

import (
	"crypto/sha256"
	"encoding/hex"
)

// DefaultPrefix is the key prefix used when Config.Prefix is empty.
const DefaultPrefix = "llmq:"

// credentialTag is the Redis hash tag of a provider key: "{<sha256 hex of id>}". Every key of one
// credential carries it, so all of them live in one Redis Cluster slot and a script may touch
// several. The raw id never reaches Redis.
func credentialTag(id string) string {
	sum := sha256.Sum256([]byte(id))
	return "{" + hex.EncodeToString(sum[:]) + "}"
}

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
