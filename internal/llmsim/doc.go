// Package llmsim is an LLM provider simulator: a real HTTP server that speaks
// enough of the Anthropic Messages API (POST /v1/messages) and the OpenAI Chat
// Completions API (POST /v1/chat/completions) for the official SDKs to accept
// it, with per-API-key request and token buckets and switchable fault
// injection.
//
// It also speaks both providers' batch APIs (batch.go): Anthropic Message
// Batches (create, retrieve, list paged by limit and after_id or before_id,
// cancel, JSONL results by custom_id) and OpenAI Batch (file upload, delete and
// list by purpose, paged by limit and after, newest or oldest first; create,
// retrieve, list paged by limit and after, cancel, output and error files),
// both batch lists newest first, answered like the online endpoint
// but outside its buckets, ended by the injected clock after
// BatchConfig.ProcessingDelay, with per-request errors (overload, rate limit,
// billing) and expiry by marker, a request over the context window refused in
// its result as online (Config.ContextTokens), a file whose delete fails (500)
// by marker,
// whole-batch expiry past the window, and the providers' cap on a batch's
// bytes (BatchConfig.MaxBytes).
//
// It is used by tests (httptest.NewServer(llmsim.New(cfg))), by benchmarks and
// as the default provider of the local stack, so that everything runs offline
// with no API key.
//
// It reads a request's field names exactly, as the providers do: "Stream" or
// "ſtream" is not stream, and "Content" is no message text (unmarshalExact).
// An integral max_tokens written 4096.0 is 4096.
//
// # Answers
//
// A successful answer is deterministic for a given request body: the reply
// text is "llmsim reply to: " followed by the first 60 characters (runes) of
// the text of the last message whose role is "user". The message id is new for
// every answer, as the real APIs give (a hash of the body and the request id).
// Token counts follow one rule:
//
//   - input tokens  = (bytes of the text of every message, plus the Anthropic
//     "system" text, plus the "tools" JSON without its white space) / 4, plus
//     the tokens of the messages' images, at least 1;
//   - output tokens = (bytes of the reply text) / 4, at least 1.
//
// The text counted: for array content, the "text" of blocks of type
// "text" and the text of "tool_result" blocks' content (read as a message's
// content), joined by newlines; other blocks count no text.
//
// An image counts as its provider bills it, from its size: an Anthropic "image" block (in a
// message, a tool result's content or a content document) width × height / 750, rounded up,
// once its long edge is brought down to 1568 px, at most 1,600; an OpenAI "image_url" part 85 at
// detail "low", else 85 + 170 per 512-px tile once fitted in 2048 × 2048 and its short side
// brought down to 768 px (at most 1,445). The size of a base64 image (PNG, JPEG, GIF or WebP;
// an OpenAI data URL) is read from the image. An image whose size the body does not tell (a URL
// or a file, data that is no such image) is charged the provider's most for one image, 1,600 or
// 1,445 (85 at low detail), what a real provider bills a large image: llmsim fetches nothing.
// This is the rule internal/tokens estimates with, implemented apart (image.go) so that the
// tests compare two readings of it; charged in the input-token buckets, reported in the usage
// (streamed too) and in batch results alike. Config.ReplyTokens > 0 instead makes every
// reply exactly that many output tokens: the text is cut (on a rune boundary)
// or padded with a fixed ASCII filler to 4 × ReplyTokens bytes, so that the
// rule above still holds; when the request's max_tokens is smaller, the reply
// is max_tokens tokens with stop_reason "max_tokens" (OpenAI: finish_reason
// "length"). Without token limits max_tokens is otherwise ignored.
//
// A request with a non-empty "tools" array is answered with the text followed by a call of its
// first tool (Anthropic a tool_use block with id "toolu_…", stop_reason "tool_use"; OpenAI
// message.tool_calls with id "call_…", finish_reason "tool_calls"), whose input is
// {"reply": <the reply text>}; the tool input is not counted in the output tokens.
// Config.ToolCalls makes several such calls (parallel calls), each with its own id.
//
// Error bodies follow each provider's format: Anthropic
// {"type":"error","error":{"type":...,"message":...},"request_id":...} and
// OpenAI {"error":{"message":...,"type":...,"param":null,"code":...}}. The
// Anthropic endpoint answers with request-id and anthropic-ratelimit-requests-*
// headers; the OpenAI endpoint with x-request-id and x-ratelimit-*-requests
// headers.
//
// # Token limits
//
// Config.InputTokensPerMinute and OutputTokensPerMinute (both 0, off, by
// default) give every API key token buckets of that many tokens per
// Config.TokenMinute (default one minute), refilling continuously and
// starting full. Counts are exact: whole tokens, integer arithmetic.
//
// The Anthropic endpoint has an input bucket and an output bucket; the OpenAI
// endpoint has one "tokens" bucket for input and output together, whose
// capacity is the sum of the two limits (or the one that is set). A key's
// token buckets on one endpoint are not drawn by the other; its request
// bucket is shared as before.
//
// Admission follows both services' documented practice: the output a request
// may produce is reserved up front and trued up afterwards. A request's
// reserve is its max_tokens (OpenAI: max_completion_tokens, else max_tokens),
// or 1 without one; with token limits on, a max_tokens that is not a positive
// integer is answered 400. On the Anthropic endpoint the input bucket must
// hold the request's input tokens and the output bucket its reserve; on the
// OpenAI endpoint the tokens bucket must hold input + reserve. If any bucket
// (the request bucket included) lacks room, the request is refused 429
// rate_limit_error (OpenAI type "tokens") with retry-after = the wait until
// every bucket has room, in whole seconds rounded up, at least 1, and
// nothing is charged. If a request exceeds a bucket's whole capacity it can
// never be admitted, and nothing is charged: the Anthropic endpoint answers
// 400 invalid_request_error saying so; the OpenAI endpoint answers as OpenAI
// does, 429 type "tokens", code rate_limit_exceeded, "Request too large for
// <model> in organization org-llmsim on tokens per min (TPM): Limit N,
// Requested M. ...", without retry-after (no wait heals it). Otherwise the buckets are charged; when the answer
// is decided the output reservation is trued up to the output tokens of a
// successful reply (usage.output_tokens), or released entirely for any other
// answer, including a client that went away. Input tokens stay charged, like
// the request token. A reply longer than its reserve (possible only without
// ReplyTokens) may overdraw a bucket; it then refuses until it refills.
//
// With token limits configured every answer to a keyed request that reaches
// the buckets carries the token headers, reporting the buckets when the
// answer is decided (after the true-up). Anthropic:
// anthropic-ratelimit-input-tokens-{limit,remaining,reset} and
// anthropic-ratelimit-output-tokens-* for each configured bucket, and
// anthropic-ratelimit-tokens-* for the two together (limits and remaining
// added up, reset the later of the two); reset is the RFC 3339 time the
// bucket is full again, with milliseconds, rounded up. OpenAI:
// x-ratelimit-limit-tokens, x-ratelimit-remaining-tokens and
// x-ratelimit-reset-tokens (the time until full, as "1.5s", rounded up to the
// millisecond). Limit is the bucket capacity as configured, so with a
// shortened TokenMinute "per minute" means per TokenMinute; remaining is the
// whole tokens in the bucket, never negative. Without token limits none of
// these headers is sent and Stats.InputTokens/OutputTokens stay 0.
//
// # Order of checks
//
// The Anthropic endpoint takes the key from x-api-key or, failing that,
// Authorization: Bearer; the OpenAI endpoint from Authorization: Bearer.
//
// For every provider request, in order: a missing API key is answered 401
// (no key, no bucket, no stats per key); the Hang fault holds the request
// until the client gives up; the spend-cap fault answers 429 without
// retry-after; then the key's buckets: with token limits, a request that can
// never fit is answered 400; the request bucket is charged one token and the
// token buckets as above, or the request is refused with 429 and retry-after;
// then the answer waits Latency plus jitter; then the overload window, the
// FailNext script and ErrorRate may replace the answer with an error; then
// the request body is validated (400), checked against the model's context
// window (Config.ContextTokens: 400 in the provider's words, Anthropic "prompt
// is too long", OpenAI context_length_exceeded) and for the bad-request marker
// (400); otherwise it succeeds. So every request that passes the buckets
// costs one request token and its input tokens, including those that then
// fail, and only the buckets' own refusals and the spend cap are free. A body
// that is not a valid request draws nothing from the token buckets.
// SlowFirstByte applies to every answer written.
//
// # Streaming
//
// A request with "stream": true that would succeed is answered as Server-Sent Events
// (text/event-stream) in the provider's format, one content token (4 bytes, never inside a
// rune) per delta, paced by Config.StreamTokensPerSecond. Anthropic: message_start (usage with
// the input tokens), content_block_start, ping, content_block_delta (text_delta) per token,
// content_block_stop, then for a tool call a tool_use block whose input comes in
// input_json_delta pieces (whole in its content_block_start with Config.StreamToolInputWhole),
// message_delta (stop_reason, usage.output_tokens), message_stop.
// OpenAI: data-only chat.completion.chunk events (the role first, a chunk per token, for a tool
// call a chunk with its id and name and chunks with argument pieces (or its whole arguments,
// Config.StreamToolInputWhole; every call whole at index 0 with Config.StreamToolCallsAtIndexZero,
// as Ollama sends them; numbered from 1 with Config.StreamToolCallsFromIndex, as proxies that
// number calls by Anthropic's content blocks send them; the name at another index than the
// arguments, every piece under an id of its own, with Config.StreamToolNamesAtIndex, as SGLang
// 0.4.6 sent them; every call's id and name at index 0 first and their arguments at 1, 2... with
// Config.StreamToolHeadersFirst, as OmniRoute's Responses-to-Chat translator sent them), then one
// with
// finish_reason, and with stream_options.include_usage a last chunk with empty choices and the
// usage), then data: [DONE]. The text, usage and stop reason equal the non-streaming answer's.
// Errors decided before the stream starts are ordinary JSON answers. The faults
// Faults.StreamFailNext, StreamFailAfter and StreamFailMode end the next streams after some
// tokens with the provider's mid-stream error (Anthropic an "error" event with
// overloaded_error; OpenAI a data chunk {"error":{...,"type":"server_error"}}), a cut
// connection, or a stall. Token buckets are charged as for the non-streaming answer.
//
// # Control endpoints
//
// GET /_sim/stats returns [Stats]; POST /_sim/reset zeroes the statistics,
// refills every bucket and restores the faults given at start;
// GET /_sim/faults returns the current [Faults]; POST /_sim/faults replaces
// them with the JSON body (snake_case fields, durations as Go duration
// strings such as "1.5s", times as RFC 3339). Invalid bodies are answered 400.
package llmsim
