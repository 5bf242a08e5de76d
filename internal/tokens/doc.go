// Package tokens is the vocabulary of LLM tokens before a request is sent: how many a request
// body counts under a fixed rule (Count), what it asks of a provider's token limits (Cost), and
// whether it can ever fit them (Limits.Check). It is pure: no clock, no state, no store.
//
// # The fixed rule
//
// Count reads an Anthropic Messages or OpenAI Chat Completions body and counts the bytes of its
// text: every message's content (a string, or the "text" blocks of an array, the content of its
// "tool_result" blocks, the input JSON of its "tool_use" blocks and the text of its "document"
// blocks whose source is "text" or "content", joined by a newline), OpenAI's assistant
// "tool_calls" (each function's name and arguments), Anthropic's top-level system text (OpenAI's
// system prompt is a message), and the "tools" definitions' and OpenAI's
// response_format.json_schema's JSON without its white space (a client's indentation is not
// input): an agent's prompt is mostly tool calls and results, and a tool's or an output's schema
// is input the provider counts. Input tokens are those bytes / 4, at least 1: the rule
// cmd/llmsim charges, so tests and benchmarks are exact. Images, base64, URL and file documents,
// audio and a provider's own framing are not counted (their base64 bytes say little of their
// tokens, and the count is the floor a request is refused as too large on); for real providers
// the ratio that internal/estimator learns absorbs the difference. MaxOutput is
// max_completion_tokens (OpenAI) or else max_tokens; DefaultMaxOutput (4,096) when absent; times
// OpenAI's n (Choices), since each choice may use the whole allowance and the answer's usage
// counts them all. An integral number written with a fraction or an exponent (4096.0) is that
// integer, as the providers' JSON Schema "integer" reads it.
//
// No real tokenizer is used: the well-kept pure-Go port of tiktoken (github.com/pkoukk/tiktoken-go)
// downloads its BPE files at run time unless github.com/pkoukk/tiktoken-go-loader embeds them, and
// both are modules this project does not depend on (and there is none for Anthropic's models).
package tokens
