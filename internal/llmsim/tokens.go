package llmsim

import (
	"fmt"
	"net/http"
	"time"
)

// tokenKind names one of a key's token buckets.
type tokenKind int

const (
	inputTokens    tokenKind = iota // Anthropic endpoint: input tokens
	outputTokens                    // Anthropic endpoint: output tokens
	combinedTokens                  // OpenAI endpoint: input + output tokens
)

// tokenLimits are the configured token buckets; nil means that kind is
// unlimited. combined is set whenever input or output is.
type tokenLimits struct {
	input, output, combined *tokenParams
}

// newTokenLimits derives the buckets from cfg: an input and an output bucket
// for the Anthropic endpoint, and one combined bucket for the OpenAI
// endpoint whose capacity is the sum of the configured limits.
func newTokenLimits(cfg Config) (tokenLimits, error) {
	var l tokenLimits
	window := cfg.tokenMinute()
	in, out := int64(cfg.InputTokensPerMinute), int64(cfg.OutputTokensPerMinute)
	if in > 0 {
		p, err := newTokenParams(in, window)
		if err != nil {
			return tokenLimits{}, fmt.Errorf("input_tokens_per_minute: %w", err)
		}
		l.input = &p
	}
	if out > 0 {
		p, err := newTokenParams(out, window)
		if err != nil {
			return tokenLimits{}, fmt.Errorf("output_tokens_per_minute: %w", err)
		}
		l.output = &p
	}
	if in+out > 0 {
		p, err := newTokenParams(in+out, window)
		if err != nil {
			return tokenLimits{}, fmt.Errorf("input_tokens_per_minute + output_tokens_per_minute: %w", err)
		}
		l.combined = &p
	}
	return l, nil
}

func (l tokenLimits) enabled() bool { return l.combined != nil }

func (l tokenLimits) params(k tokenKind) *tokenParams {
	switch k {
	case inputTokens:
		return l.input
	case outputTokens:
		return l.output
	}
	return l.combined
}

// keyTokens is one API key's token buckets.
type keyTokens struct {
	input, output, combined tokenBucket
}

func (t *keyTokens) bucket(k tokenKind) *tokenBucket {
	switch k {
	case inputTokens:
		return &t.input
	case outputTokens:
		return &t.output
	}
	return &t.combined
}

// tokenCost is what one request asks of the token buckets.
type tokenCost struct {
	model   string
	input   int64 // the request's input tokens
	reserve int64 // output tokens reserved up front: max_tokens, or 1 without it
}

// requestCost reads a request's cost, or returns nil when the body is not a
// valid request (it draws no tokens and is answered 400 later).
func requestCost(body []byte) *tokenCost {
	req, err := parseChatRequest(body)
	if err != nil || req.maxTokensErr != nil {
		return nil
	}
	return &tokenCost{model: req.model, input: int64(req.inputTokens()), reserve: max(req.maxTokens, 1)}
}

// tokenCharge is one bucket's share of a request's cost.
type tokenCharge struct {
	kind tokenKind
	n    int64
}

// charges lists the configured buckets a request draws from: on the
// Anthropic endpoint its input tokens from the input bucket and its reserve
// from the output bucket; on the OpenAI endpoint both from the combined one.
func (l tokenLimits) charges(combined bool, c tokenCost) []tokenCharge {
	if combined {
		return []tokenCharge{{combinedTokens, c.input + c.reserve}}
	}
	var out []tokenCharge
	if l.input != nil {
		out = append(out, tokenCharge{inputTokens, c.input})
	}
	if l.output != nil {
		out = append(out, tokenCharge{outputTokens, c.reserve})
	}
	return out
}

// outputKind is the bucket that the reply's output tokens are trued up in;
// ok is false when output tokens are not limited on this endpoint.
func (l tokenLimits) outputKind(combined bool) (tokenKind, bool) {
	if combined {
		return combinedTokens, true
	}
	return outputTokens, l.output != nil
}

// tokenView is the token buckets as the headers report them; nil entries are
// not configured (or not used by the endpoint).
type tokenView struct {
	input, output, combined *tokenState
}

// view brings the endpoint's buckets up to now and reports them.
func (l tokenLimits) view(t *keyTokens, combined bool, now time.Time) *tokenView {
	v := &tokenView{}
	report := func(k tokenKind) *tokenState {
		p := l.params(k)
		if p == nil {
			return nil
		}
		b := t.bucket(k)
		b.advance(*p, now)
		st := b.state(*p)
		return &st
	}
	if combined {
		v.combined = report(combinedTokens)
	} else {
		v.input, v.output = report(inputTokens), report(outputTokens)
	}
	return v
}

// tooLargeRefusal is the answer to a charge that can never be admitted, larger than its bucket's
// capacity: on the Anthropic endpoint a 400 invalid_request_error saying so; on the OpenAI
// endpoint (its combined bucket) OpenAI's own answer, a 429 of type tokens, code
// rate_limit_exceeded, "Request too large for …", which admit sends without retry-after (no wait
// heals it).
func tooLargeRefusal(ch tokenCharge, c tokenCost, capacity int64) *apiError {
	switch ch.kind {
	case inputTokens:
		return &apiError{status: http.StatusBadRequest, message: fmt.Sprintf("prompt is %d input tokens, more than the "+
			"whole input-token rate limit of %d per minute: this request can never be admitted; shorten the prompt",
			ch.n, capacity)}
	case outputTokens:
		return &apiError{status: http.StatusBadRequest, message: fmt.Sprintf("max_tokens: %d is more than the whole "+
			"output-token rate limit of %d per minute: this request can never be admitted; lower max_tokens",
			ch.n, capacity)}
	}
	return &apiError{status: http.StatusTooManyRequests, kind: kindTokens, message: fmt.Sprintf("Request too large for %s "+
		"in organization org-llmsim on tokens per min (TPM): Limit %d, Requested %d. The input or output tokens must be "+
		"reduced in order to run successfully. Visit https://platform.openai.com/account/rate-limits to learn more.",
		c.model, capacity, ch.n)}
}

// rateLimitedMessage explains a refusal by a token bucket.
func rateLimitedMessage(ch tokenCharge, c tokenCost, st tokenState, wait time.Duration) string {
	switch ch.kind {
	case inputTokens, outputTokens:
		what := "input"
		if ch.kind == outputTokens {
			what = "output"
		}
		return fmt.Sprintf("This request would exceed the rate limit for your organization of %d %s tokens per minute. "+
			"Please reduce the prompt length or the maximum tokens requested, or try again later.", st.limit, what)
	}
	return fmt.Sprintf("Rate limit reached for %s on tokens per min (TPM): Limit %d, Used %d, Requested %d. "+
		"Please try again in %s.", c.model, st.limit, st.limit-st.remaining, ch.n, formatOpenAIDuration(wait))
}
