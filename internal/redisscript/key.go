package redisscript

import (
	"crypto/sha256"
	"encoding/hex"
)

// DefaultPrefix starts every key of llmq's shared state in Redis when no prefix is configured.
const DefaultPrefix = "llmq:"

// CredentialTag is the Redis hash tag of a credential's id: "{<sha256 hex of id>}". Every key of
// one credential carries it, so all of them live in one Redis Cluster slot. The raw id never
// reaches Redis.
func CredentialTag(id string) string {
	sum := sha256.Sum256([]byte(id))
	return "{" + hex.EncodeToString(sum[:]) + "}"
}
