package llmsim

import (
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"time"
)

// Config configures a [Server]. The zero value is valid: unlimited, no
// latency, no faults, real clock, fixed-seed randomness, no logging.
type Config struct {
	// Capacity is the size of each API key's token bucket, in requests.
	// A bucket starts full. 0 (the default) means unlimited: no request bucket
	// and no request rate-limit headers. Otherwise it must be at least 1.
	Capacity float64
	// RefillPerSecond is how many tokens per second flow back into a bucket,
	// continuously. Required (> 0) when Capacity > 0.
	RefillPerSecond float64
	// InputTokensPerMinute is the size of each API key's input-token bucket:
	// that many tokens per TokenMinute, refilling continuously, starting full.
	// 0 (the default) means unlimited. With neither token limit set there are
	// no token buckets, no token headers and no token counts in [Stats].
	// See the package comment for the admission rule and the headers.
	InputTokensPerMinute int
	// OutputTokensPerMinute is the size of each API key's output-token
	// bucket, like InputTokensPerMinute. 0 (the default) means unlimited.
	OutputTokensPerMinute int
	// TokenMinute is the refill period of the token buckets: a bucket of N
	// tokens refills N tokens per TokenMinute. Default one minute; benchmarks
	// shorten it to scale time down. Rate-limit headers report the bucket
	// capacity as-is, so with a shorter TokenMinute their "per minute" means
	// per TokenMinute.
	TokenMinute time.Duration
	// ReplyTokens, when > 0, makes every successful reply exactly this many
	// output tokens, the text padded (or cut) deterministically so that
	// usage and text agree with the token rule; a request whose max_tokens is
	// smaller gets max_tokens tokens and stop reason "max_tokens" (OpenAI:
	// finish reason "length"), as a real model stops at its limit. 0 (the
	// default) keeps the reply of the package comment.
	ReplyTokens int
	// ContextTokens is the model's context window, in tokens (the package comment's rule):
	// a request over it is refused 400 in the provider's words. Anthropic counts the input
	// ("prompt is too long: N tokens > M maximum", invalid_request_error); OpenAI the input
	// plus max_tokens (code context_length_exceeded). A batch's request over it is refused so
	// in its own result (Anthropic's errored result, OpenAI's error-file line). 0 (the default)
	// means no window.
	ContextTokens int
	// StreamTokensPerSecond paces streamed answers: one content token (4 bytes of text) per
	// 1/StreamTokensPerSecond. 0 (the default) sends them as fast as the connection takes them.
	StreamTokensPerSecond float64
	// StreamToolInputWhole streams a tool call whole, as some compatible servers do: Anthropic's
	// tool_use block with its input in content_block_start and no input_json_delta, OpenAI's call
	// with its whole arguments in its first chunk. false (the default) streams the input in
	// pieces, as the real APIs do.
	StreamToolInputWhole bool
	// ToolCalls is how many calls of the request's first tool an answer to a request with tools
	// makes (parallel calls), each with its own id and the same input. 0 (the default) makes one.
	ToolCalls int
	// StreamToolCallsAtIndexZero streams every OpenAI tool call at index 0, each whole (its id,
	// name and arguments) in a chunk of its own, as Ollama's compatible endpoint does when its
	// model's parser numbers no calls. false (the default) numbers them 0, 1..., as the API does.
	StreamToolCallsAtIndexZero bool
	// StreamToolCallsFromIndex is the index the first OpenAI tool call is streamed at, the next
	// ones following it: 1 streams them at 1, 2..., as proxies that number calls by Anthropic's
	// content blocks do after a text block (LiteLLM over Bedrock, CLIProxyAPI). 0 (the default)
	// numbers them from 0, as the API does. StreamToolCallsAtIndexZero overrides it.
	StreamToolCallsFromIndex int
	// StreamToolNamesAtIndex, when more than 0, streams each OpenAI tool call's name at that index
	// and its arguments at index 0, every piece under an id of its own and the arguments' pieces
	// with an empty name, as SGLang 0.4.6 sent them (a call's name at the index of its tool in the
	// request's tools, its arguments at the call's own index, 0 for each with Qwen's parser). 0
	// (the default) streams a call's pieces at one index, as the API does. It overrides
	// StreamToolCallsFromIndex; StreamToolCallsAtIndexZero overrides it.
	StreamToolNamesAtIndex int
	// StreamToolHeadersFirst streams every OpenAI tool call's header (its id and name, empty
	// arguments) at index 0, all before any arguments, then each call's whole arguments, without
	// id or name, at index 1, 2... in the calls' order, as OmniRoute's Responses-to-Chat
	// translator sent parallel calls (its index advanced only as a call closed). false (the
	// default) streams a call's pieces at one index, as the API does. It overrides
	// StreamToolNamesAtIndex and StreamToolCallsFromIndex; StreamToolCallsAtIndexZero overrides it.
	StreamToolHeadersFirst bool
	// Latency is how long every answer that passed the bucket waits before it
	// is written. Default 0. The wait ends early if the client goes away.
	Latency time.Duration
	// LatencyJitter adds U(0, LatencyJitter) to Latency. Default 0.
	LatencyJitter time.Duration
	// Faults are the faults active at start and restored by Reset.
	Faults Faults
	// Now is the clock used for buckets, the overload window, rate-limit
	// headers and "created" timestamps. Default time.Now. Waits (latency,
	// slow first byte) use real timers regardless.
	Now func() time.Time
	// Rand returns a float64 in [0, 1); it draws latency jitter and the
	// ErrorRate coin. It is always called with the server's lock held, so it
	// need not be safe for concurrent use. Default: a PCG source with a fixed
	// seed, so runs are reproducible.
	Rand func() float64
	// Batch configures the batch APIs (see [BatchConfig]).
	Batch BatchConfig
	// Logger receives one debug line per answer (endpoint, key id, status,
	// duration). It never receives API keys or prompts. Default: discard.
	Logger *slog.Logger
}

// Validate reports the first invalid field of c, naming it, or nil.
func (c Config) Validate() error {
	switch {
	case c.Capacity < 0:
		return errors.New("capacity: must not be negative")
	case c.Capacity > 0 && c.Capacity < 1:
		return errors.New("capacity: must be 0 (unlimited) or at least 1")
	case c.RefillPerSecond < 0:
		return errors.New("refill_per_second: must not be negative")
	case c.Capacity > 0 && c.RefillPerSecond == 0:
		return errors.New("refill_per_second: required when capacity is set")
	case c.Latency < 0:
		return errors.New("latency: must not be negative")
	case c.LatencyJitter < 0:
		return errors.New("latency_jitter: must not be negative")
	case c.InputTokensPerMinute < 0:
		return errors.New("input_tokens_per_minute: must not be negative")
	case c.OutputTokensPerMinute < 0:
		return errors.New("output_tokens_per_minute: must not be negative")
	case c.TokenMinute < 0:
		return errors.New("token_minute: must not be negative")
	case c.StreamTokensPerSecond < 0:
		return errors.New("stream_tokens_per_second: must not be negative")
	case c.ReplyTokens < 0:
		return errors.New("reply_tokens: must not be negative")
	case c.ContextTokens < 0:
		return errors.New("context_tokens: must not be negative")
	case c.ToolCalls < 0:
		return errors.New("tool_calls: must not be negative")
	case c.StreamToolNamesAtIndex < 0:
		return errors.New("stream_tool_names_at_index: must not be negative")
	}
	if _, err := newTokenLimits(c); err != nil {
		return err
	}
	if err := c.Faults.validate(); err != nil {
		return fmt.Errorf("faults: %w", err)
	}
	return c.Batch.validate()
}

// tokenMinute is TokenMinute with its default.
func (c Config) tokenMinute() time.Duration {
	if c.TokenMinute == 0 {
		return time.Minute
	}
	return c.TokenMinute
}

func (c Config) withDefaults() Config {
	c.Batch = c.Batch.withDefaults()
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.Rand == nil {
		c.Rand = rand.New(rand.NewPCG(0x6c6c6d73, 0x696d)).Float64
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}
