// Package estimator learns, per credential, tenant and model, how the provider's token counts
// relate to the fixed rule of internal/tokens, so that a request reserves close to what it will
// be charged. Per tenant: how far a prompt's tokens are from its bytes / 4 depends on what it
// holds (images, code, whitespace runs), and one tenant's prompts must not set what another's
// reserve.
//
// An Estimator scales the rule by the ratio between what the provider reported (the whole
// prompt: usage.input_tokens, and Anthropic's cache_creation_input_tokens and
// cache_read_input_tokens) and the rule's count, each report's clamped to [MinRatio, MaxRatio]:
// the sum of the reports' tokens over the sum of their estimates, each decayed by 1 - Alpha (0.2)
// per later report, the ratio it starts from counted as PriorWeight (1,000) tokens. A report
// weighs its prompt's size: one small answer (an image of few bytes and many tokens) cannot set
// what a tenant's big prompts reserve, and reports of one size make the exponentially weighted
// moving average of weight Alpha. A tenant not yet reported on starts at InitialRatio or, when
// higher, the ratio learned the same way for the credential and model from every tenant's
// answers (never lower: one tenant's prompts do not make another's under-reserve). The state is
// in memory, per process: each worker process learns from its own responses (a few are enough;
// a restarted process starts conservative again), and no Redis round trip is added to a
// request. At most MaxEntries (credential, tenant, model) entries, and apart MaxEntries
// (credential, model) ones (each the tenant's whose answer made it), are kept; beyond, the least
// recently used entry of a tenant holding its share of MaxEntries or more (the inserting
// tenant's own first, else the tenant holding the most; no scan) is forgotten: a tenant making up
// model names (a gateway takes any) forgets its own, not the other tenants' ratios.
//
// NewMetrics registers llmq_tokens_estimate_ratio{credential}: the histogram of the estimate used
// divided by the prompt tokens the provider reported (1 is exact, above 1 over-estimated).
package estimator
