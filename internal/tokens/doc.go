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
// is input the provider counts. Input tokens are those bytes / 4, plus the tokens of the images,
// at least 1: the rule cmd/llmsim charges, images included (internal/llmsim implements it apart
// and its tests compare the two), so tests and benchmarks are exact.
//
// An image counts as its provider bills it, from its size: Anthropic's "image" block width ×
// height / 750 once resized (long edge at most 1568 px, about 1.2 megapixels: at most
// AnthropicMaxImageTokens), OpenAI's "image_url" part 85 at low detail, else 85 + 170 per 512-px
// tile once fitted in 2048 × 2048 and its short side brought down to 768 (the GPT-4o family's
// rule; models that bill a multiple of it are left to the learned ratio). The size of a base64
// image (PNG, JPEG, GIF or WebP) is read from its header, never the whole image: at most 128 KB
// of it is decoded. An image whose size the body does not tell (a URL, a file, a header that
// does not read) counts the provider's most for one image, so that the reservation errs on the
// safe side; it may be a small one, so MinInput, the least the input can be and what a request
// is refused as too large on, leaves it out. Base64, URL and file documents, audio and a
// provider's own framing are not counted (their bytes say little of their tokens, and the count
// is the floor a request is refused as too large on); for real providers the ratio that
// internal/estimator learns absorbs the difference. MaxOutput is max_completion_tokens (OpenAI)
// or else max_tokens; DefaultMaxOutput (4,096) when absent; times
// OpenAI's n (Choices), since each choice may use the whole allowance and the answer's usage
// counts them all. An integral number written with a fraction or an exponent (4096.0) is that
// integer, as the providers' JSON Schema "integer" reads it.
//
// No real tokenizer is used: the well-kept pure-Go port of tiktoken (github.com/pkoukk/tiktoken-go)
// downloads its BPE files at run time unless github.com/pkoukk/tiktoken-go-loader embeds them, and
// both are modules this project does not depend on (and there is none for Anthropic's models).
package tokens
