package worker

import (
	"testing"

	"github.com/llmq/llmq/internal/breaker"
	"github.com/llmq/llmq/internal/config"
)

// The config checks a max_cooldown given alone against the breaker's default cooldown, which it
// cannot import (the API links config, and must not link the breaker).
func TestConfigKnowsTheBreakersDefaultCooldown(t *testing.T) {
	t.Parallel()
	if config.DefaultBreakerCooldown != breaker.DefaultCooldown {
		t.Fatalf("config.DefaultBreakerCooldown %v, breaker.DefaultCooldown %v", config.DefaultBreakerCooldown, breaker.DefaultCooldown)
	}
}
