// Package estimator learns, per credential and model, how the provider's token counts relate to
// the fixed rule of internal/tokens, so that a request reserves close to what it will be charged.
//
// An Estimator scales the rule by the ratio between what the provider reported (the whole
// prompt: usage.input_tokens, and Anthropic's cache_creation_input_tokens and
// cache_read_input_tokens) and the rule's count: InitialRatio (1.25, conservative) until the first
// report, then that report's ratio, then an exponentially weighted moving average (Alpha 0.2),
// clamped to [MinRatio, MaxRatio]. The state is in memory, per process: each worker process
// learns from its own responses (a few are enough; a restarted process starts conservative
// again), and no Redis round trip is added to a request. At most MaxEntries pairs are kept;
// beyond, an arbitrary one is forgotten.
//
// NewMetrics registers llmq_tokens_estimate_ratio{credential}: the histogram of the estimate used
// divided by the prompt tokens the provider reported (1 is exact, above 1 over-estimated).
package estimator
