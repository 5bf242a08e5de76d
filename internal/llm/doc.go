// Package llm sends one LLM request to a provider over plain net/http and returns a typed
// result. It speaks the Anthropic Messages API and the OpenAI Chat Completions API.
//
// The request body is the job's provider-native JSON and is sent verbatim (a stream to OpenAI
// gets stream_options.include_usage when it sets none); the response body is returned verbatim,
// or, for a stream (stream.go), assembled from its events into the message a non-streaming call
// returns, its deltas handed to SendOptions.OnDelta on the way. One Send is exactly one HTTP
// request: there is no retry loop
// here (internal/retrypolicy decides about retries) and no SDK underneath whose own retries
// could multiply ours.
//
// Errors from Send are one of:
//   - *StatusError: the provider answered with a non-2xx status, or with its error object
//     under a 2xx (a whole body whose top-level "error" says something, or a stream's error event;
//     StatusCode is then the status the provider gives that error type). It exposes
//     HTTPStatus, ResponseHeader and ErrorType so that retrypolicy can classify it without
//     importing this package.
//   - *TransportError: no complete answer arrived (refused, reset, DNS, TLS, a body cut
//     short, a close-delimited body's JSON included, a deadline or a cancellation).
//     errors.Is(err, context.Canceled) and errors.Is(err, context.DeadlineExceeded) hold when
//     the context ended the call.
//   - an error wrapping ErrInvalidRequest: the body (not a JSON object) was refused before anything was sent.
//   - an error wrapping ErrDecode (or ErrResponseTooLarge): a 2xx answer we cannot use.
//
// Provider text is untrusted. Every string this package returns that came from the provider
// (an error's text and fields, response headers, a body) has the API key removed in every form
// a provider or proxy may echo it (any letter case, URL-escaped, base64 at any alignment: see
// redact.go), before anything is cut from it; texts kept in errors also have control characters
// and invalid UTF-8 replaced (Postgres refuses a NUL; a terminal must not get escape sequences).
// A 2xx body has the key masked byte for byte, so that its JSON stays valid; one that the mask
// would break is an ErrDecode. No error string contains the API key or the request body.
//
// Memory: a 2xx body is capped at Config.MaxResponseBytes, and an AnswerBudget shared by the
// Providers of a process bounds the bytes of all answers held at once: a call waits for room,
// and its Response holds the room until Release.
package llm
