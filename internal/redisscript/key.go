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

// CredentialIndexKey is a Redis hash from credential name to its CredentialTag. Workers, which
// hold the provider keys, write it at start, so that a process without the keys (the API's
// console) finds a credential's shared state by name. A tag is no secret: it is in every key name
// of the credential already.
func CredentialIndexKey(prefix string) string { return prefix + "credential-tags" }
