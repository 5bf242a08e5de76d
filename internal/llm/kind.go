package llm

import (
	"fmt"
	"strings"
)

// Kind names a provider API dialect.
type Kind string

// The supported provider kinds.
const (
	// KindAnthropic is the Anthropic Messages API (POST /v1/messages).
	KindAnthropic Kind = "anthropic"
	// KindOpenAI is the OpenAI Chat Completions API (POST /v1/chat/completions).
	KindOpenAI Kind = "openai"
)

// ParseKind returns the Kind named by s, ignoring case and surrounding space. It returns an
// error naming s and the accepted values when s is not a known kind.
func ParseKind(s string) (Kind, error) {
	switch k := Kind(strings.ToLower(strings.TrimSpace(s))); k {
	case KindAnthropic, KindOpenAI:
		return k, nil
	default:
		return "", fmt.Errorf("llm: unknown provider kind %q (want %q or %q)", s, KindAnthropic, KindOpenAI)
	}
}

// String returns the kind's name.
func (k Kind) String() string { return string(k) }
