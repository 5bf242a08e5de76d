package tokens

import (
	"errors"
	"fmt"
)

// Cost is what one request asks of the token buckets: its estimated input tokens and its output
// allowance (max_tokens). The combined bucket is charged both.
type Cost struct {
	// InputTokens is the estimated input (prompt) tokens.
	InputTokens int
	// OutputTokens is the output tokens reserved (the request's max_tokens), or, in Reconcile,
	// the output tokens the provider reported.
	OutputTokens int
	// MinInputTokens, when set, is the least the input can be (an unscaled estimate, where
	// InputTokens is scaled up to be safe). A request is too large only when MinInputTokens
	// exceeds a bucket; when only InputTokens does, the whole bucket is reserved instead. Ignored
	// by Reconcile.
	MinInputTokens int
}

// FitInput is the input that must fit a bucket: MinInputTokens when set, else InputTokens.
func (c Cost) FitInput() int {
	if c.MinInputTokens > 0 && c.MinInputTokens < c.InputTokens {
		return c.MinInputTokens
	}
	return c.InputTokens
}

// Bucket names a token bucket.
type Bucket string

// The token buckets of a credential.
const (
	// BucketInput is the input-token bucket (Anthropic's input tokens per minute).
	BucketInput Bucket = "input_tokens"
	// BucketOutput is the output-token bucket (Anthropic's output tokens per minute).
	BucketOutput Bucket = "output_tokens"
	// BucketTokens is the bucket of input and output tokens together (OpenAI's tokens per minute).
	BucketTokens Bucket = "tokens"
)

// ErrTooLarge is matched (errors.Is) by every *TooLargeError.
var ErrTooLarge = errors.New("request larger than a whole token bucket")

// TooLargeError is a request whose cost exceeds the whole capacity of a token bucket: it can never
// be sent, however long it waits. Fail it (at submit if possible) instead of queueing it.
type TooLargeError struct {
	// Bucket is the bucket it does not fit in.
	Bucket Bucket
	// Cost is what the request asks of that bucket, in tokens.
	Cost int
	// Capacity is the bucket's whole capacity, in tokens.
	Capacity int
	// Learned reports a capacity learned from the provider's rate-limit headers, none being
	// configured for the bucket: the provider may change it (a tier raised), and no check of
	// the configuration (at submit) knows it.
	Learned bool
}

// Error says which bucket, the cost and the capacity, and whether the capacity was learned.
func (e *TooLargeError) Error() string {
	what := map[Bucket]string{BucketInput: "input tokens", BucketOutput: "output tokens (max_tokens)",
		BucketTokens: "input + output tokens (prompt + max_tokens)"}[e.Bucket]
	if what == "" {
		what = string(e.Bucket)
	}
	msg := fmt.Sprintf("request needs %d %s but the credential's whole %s limit is %d per minute: "+
		"it can never be sent", e.Cost, what, e.Bucket, e.Capacity)
	if e.Learned {
		msg += " (a limit learned from the provider's rate-limit headers, none configured: it may change)"
	}
	return msg
}

// AssumedOutputNote is what to add to err's text when err is a *TooLargeError over the output
// (or the combined bucket) of a request that sets no output allowance (assumed: see
// Request.AssumedOutput) of provider's: that DefaultMaxOutput was assumed, so that the refusal
// does not blame a max_tokens the client never sent. "" otherwise.
func AssumedOutputNote(err error, assumed bool, provider string) string {
	var tl *TooLargeError
	if !assumed || !errors.As(err, &tl) || tl.Bucket == BucketInput {
		return ""
	}
	if provider == ProviderOpenAI {
		return fmt.Sprintf(" (the request sets no max_completion_tokens or max_tokens: %d assumed per choice)", DefaultMaxOutput)
	}
	return fmt.Sprintf(" (the request sets no max_tokens: %d assumed)", DefaultMaxOutput)
}

// Is reports whether target is ErrTooLarge.
func (e *TooLargeError) Is(target error) bool { return target == ErrTooLarge }

// Limits are a credential's token limits, per minute (0: no such limit).
type Limits struct {
	// InputPerMinute limits input tokens (Anthropic's input tokens per minute).
	InputPerMinute float64
	// OutputPerMinute limits output tokens (Anthropic's output tokens per minute).
	OutputPerMinute float64
	// CombinedPerMinute limits input and output tokens together (OpenAI's tokens per minute).
	CombinedPerMinute float64
}

// Check returns a *TooLargeError when cost exceeds a whole bucket of l (input tokens, output
// tokens, or both against CombinedPerMinute; the input is Cost.FitInput), else nil.
func (l Limits) Check(cost Cost) error {
	for _, b := range []struct {
		bucket   Bucket
		capacity float64
		n        int
	}{
		{BucketInput, l.InputPerMinute, cost.FitInput()},
		{BucketOutput, l.OutputPerMinute, cost.OutputTokens},
		{BucketTokens, l.CombinedPerMinute, cost.FitInput() + cost.OutputTokens},
	} {
		if b.capacity > 0 && float64(b.n) > b.capacity {
			return &TooLargeError{Bucket: b.bucket, Cost: b.n, Capacity: int(b.capacity)}
		}
	}
	return nil
}
