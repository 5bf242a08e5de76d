// Package redisscript is the one home of what every Redis Lua script of llmq shares: the key
// layout of a credential (its hash tag), the Lua prelude the scripts start with, the decoding of
// their replies, the sending of the scripts every job runs (Script), and the pipelined sending of
// several packages' calls in one round trip.
//
// # Scripts
//
// A Script sends its calls as go-redis's Script.Run does (EVALSHA, then EVAL on NOSCRIPT, to the
// first key's node on a Cluster) but holds its SHA and source boxed once, and takes its keys
// boxed ([]any of strings): go-redis boxed the SHA and every key at every call, some two dozen
// calls a job. A caller that builds its keys once keeps them boxed too. The arguments that change
// at every call (a time, a call id, a rate, a count) are formatted into one buffer (Args) and sent
// from it, byte for byte the strings and integers they replace, for one allocation a call; bytes
// the caller holds already (a stream entry's JSON) are sent from where they are (Bytes).
//
// # Keys
//
// Every key of one credential carries its hash tag, "{<sha256 hex of the credential's id>}"
// (CredentialTag), so that the limiter's and the breaker's keys of a credential live in one Redis
// Cluster slot and a script may touch several of them. The raw id (derived from the provider key)
// never reaches Redis. Keys read "<prefix><tag>:<suffix>", DefaultPrefix being "llmq:".
//
// # Times
//
// Times inside the scripts are integer microseconds since the Unix epoch (exact in a Lua double
// until the year 2255). They are written with %.0f, never tostring, which keeps only 14 digits.
// A script's "now" argument is the caller's injected clock (NowArg), or empty for Redis TIME, so
// that every process shares one clock.
//
// # Pipelines
//
// Run sends the calls of several packages in one round trip: the limiter's observation of an
// answer and the breaker's report of it, say, which a worker otherwise sends one after the other
// after every provider call. A pipelined EVALSHA of a script Redis has not cached (after a restart
// or SCRIPT FLUSH) fails with NOSCRIPT and does nothing; Script.Run falls back to EVAL only
// outside a pipeline, so Run does it: after the round trip it sends those calls again with
// EVAL (which caches the script), in their order. The calls that did run are not sent twice.
//
// # Calls sent again
//
// go-redis sends a call (or a pipeline) again on a new connection when the connection failed
// after the write, and Redis may have run it already. A script whose second run would do its work
// twice takes a call id (CallIDs) and keeps what the call did under it (see CallKeep).
package redisscript
