// Package tokens estimates what an LLM request costs a provider's token limits before it is sent:
// its input tokens, and its output allowance (max_tokens).
//
// # The fixed rule
//
// Count reads an Anthropic Messages or OpenAI Chat Completions body and counts the bytes of its
// text: every message's content (a string, or the "text" blocks of an array, joined by a newline)
// plus Anthropic's top-level system text (OpenAI's system prompt is a message). Input tokens are
// those bytes / 4, at least 1: the rule cmd/llmsim charges, so tests and benchmarks are exact.
// Images, tool definitions and a provider's own framing are not counted; for real providers the
// learned ratio below absorbs the difference. MaxOutput is max_completion_tokens (OpenAI) or else
// max_tokens; DefaultMaxOutput (4,096) when absent.
//
// No real tokenizer is used: the well-kept pure-Go port of tiktoken (github.com/pkoukk/tiktoken-go)
// downloads its BPE files at run time unless github.com/pkoukk/tiktoken-go-loader embeds them, and
// both are modules this project does not depend on (and there is none for Anthropic's models). The
// learned ratio makes the rule accurate per credential and model instead.
//
// # The learned ratio
//
// An Estimator scales the rule per (credential, model) by the ratio between what the provider
// reported (usage.input_tokens) and the rule's count: InitialRatio (1.25, conservative) until the
// first report, then that report's ratio, then an exponentially weighted moving average (Alpha
// 0.2), clamped to [MinRatio, MaxRatio]. The state is in memory, per process: each worker
// process learns from its own responses (a few are enough; a restarted process starts
// conservative again), and no Redis round trip is added to a request. At most MaxEntries pairs are
// kept; beyond, an arbitrary one is forgotten.
//
// # Metrics
//
// NewMetrics registers llmq_tokens_estimate_ratio{credential}: the histogram of the estimate used
// divided by the input tokens the provider reported (1 is exact, above 1 over-estimated).
package tokens
