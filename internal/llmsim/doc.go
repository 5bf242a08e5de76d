// Package llmsim is an LLM provider simulator: a real HTTP server that speaks
// enough of the Anthropic Messages API (POST /v1/messages) and the OpenAI Chat
// Completions API (POST /v1/chat/completions) for the official SDKs to accept
// it, with a per-API-key token bucket and switchable fault injection.
//
// It is used by tests (httptest.NewServer(llmsim.New(cfg))), by benchmarks and
// as the default provider of the local stack, so that everything runs offline
// with no API key.
//
// # Answers
//
// A successful answer is deterministic for a given request body: the reply
// text is "llmsim reply to: " followed by the first 60 characters (runes) of
// the text of the last message whose role is "user", and the message id is
// derived from a hash of the request body. Token counts follow one rule:
//
//   - input tokens  = (bytes of the text of every message, plus the Anthropic
//     "system" text) / 4, at least 1;
//   - output tokens = (bytes of the reply text) / 4, at least 1.
//
// Only text is counted: for array content, the "text" of blocks of type
// "text"; other blocks count zero. max_tokens is accepted and ignored.
//
// Error bodies follow each provider's format: Anthropic
// {"type":"error","error":{"type":...,"message":...},"request_id":...} and
// OpenAI {"error":{"message":...,"type":...,"param":null,"code":...}}. The
// Anthropic endpoint answers with request-id and anthropic-ratelimit-requests-*
// headers; the OpenAI endpoint with x-request-id and x-ratelimit-*-requests
// headers.
//
// # Order of checks
//
// For every provider request, in order: a missing API key is answered 401
// (no key, no bucket, no stats per key); the Hang fault holds the request
// until the client gives up; the spend-cap fault answers 429 without
// retry-after; the key's bucket is charged one token or the request is
// refused with 429 and retry-after; then the answer waits Latency plus
// jitter; then the overload window, the FailNext script and ErrorRate may
// replace the answer with an error; then the request body is validated (400)
// and checked for the bad-request marker (400); otherwise it succeeds.
// So every request that passes the bucket costs one token, including those
// that then fail, and only the bucket's own refusal and the spend cap are
// free. SlowFirstByte applies to every answer written.
//
// # Control endpoints
//
// GET /_sim/stats returns [Stats]; POST /_sim/reset zeroes the statistics,
// refills every bucket and restores the faults given at start;
// GET /_sim/faults returns the current [Faults]; POST /_sim/faults replaces
// them with the JSON body (snake_case fields, durations as Go duration
// strings such as "1.5s", times as RFC 3339). Invalid bodies are answered 400.
package llmsim
