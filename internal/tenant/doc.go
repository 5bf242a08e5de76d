// Package tenant owns who may call the API: tenants, their bearer tokens, and the per-tenant
// submit rate limit.
//
// A tenant is a name, a bearer token and, optionally, the credentials its jobs may use. The token
// ("llmq_" + 43 base64url characters: 32 random bytes) is returned once, by Store.Create; only its
// SHA-256 is stored in Postgres, so a database dump cannot authenticate anyone. Revoking a tenant
// keeps its row, so that its token answers ErrRevoked (403) rather than ErrUnknownBearerToken (401).
//
// Authenticator caches lookups for a short TTL (default 2s) so that an API replica does not query
// Postgres on every request; a revocation therefore takes effect within that TTL on every replica.
//
// RateLimiter is a GCRA limit per tenant kept in Redis, so every API replica shares it.
package tenant
