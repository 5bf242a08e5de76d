package llm

import (
	"encoding/json"
	"net/http"
	"time"
)

// anthropicVersion is the Messages API version header value.
const anthropicVersion = "2023-06-01"

// anthropic is the Anthropic Messages API dialect.
type anthropic struct{}

func (anthropic) kind() Kind   { return KindAnthropic }
func (anthropic) path() string { return "/v1/messages" }

func (anthropic) setHeaders(h http.Header, apiKey string) {
	if apiKey != "" {
		h.Set("X-Api-Key", apiKey)
	}
	h.Set("Anthropic-Version", anthropicVersion)
}

func (anthropic) rateLimit(h http.Header, _ time.Time) RateLimit { return parseAnthropicRateLimit(h) }

func (anthropic) usage(raw json.RawMessage) Usage {
	var n [4]int
	if reported, ok := readInts(raw, anthropicUsage, n[:]); ok {
		u := Usage{InputTokens: n[0], CacheCreationInputTokens: n[2], CacheReadInputTokens: n[3]}
		return u.withOutput(reportedInt(reported, 1, n[:]))
	}
	var u struct {
		Usage
		Output *int `json:"output_tokens"` // nil: not reported (Usage.OutputUnreported)
	}
	_ = json.Unmarshal(raw, &u) // best effort: a malformed usage object leaves zeros
	return u.withOutput(u.Output)
}
