package llm

import (
	"encoding/json"
	"net/http"
	"time"
)

// openAI is the OpenAI Chat Completions API dialect.
type openAI struct{}

func (openAI) kind() Kind   { return KindOpenAI }
func (openAI) path() string { return "/v1/chat/completions" }

func (openAI) setHeaders(h http.Header, apiKey string) {
	if apiKey != "" {
		h.Set("Authorization", "Bearer "+apiKey)
	}
}

func (openAI) rateLimit(h http.Header, received time.Time) RateLimit {
	return parseOpenAIRateLimit(h, received)
}

func (openAI) usage(raw json.RawMessage) Usage {
	var n [2]int
	if reported, ok := readInts(raw, openAIUsage, n[:]); ok {
		return Usage{InputTokens: n[0]}.withOutput(reportedInt(reported, 1, n[:]))
	}
	var u struct {
		PromptTokens     int  `json:"prompt_tokens"`
		CompletionTokens *int `json:"completion_tokens"` // nil: not reported (Usage.OutputUnreported)
	}
	_ = json.Unmarshal(raw, &u) // best effort: a malformed usage object leaves zeros
	return Usage{InputTokens: u.PromptTokens}.withOutput(u.CompletionTokens)
}
