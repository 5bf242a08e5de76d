package main

import (
	"io"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/config"
)

// Every -window the batch bench takes writes a batch block llmq's config loads (online_fallback
// below the window, max_wait_to_fill within it, the window at most 24h); one it would refuse is
// refused by the flag, before anything is created.
func TestBatchBench_WindowFlag(t *testing.T) {
	t.Parallel()
	for _, w := range []string{"1001ms", "2s", "1m", "24h"} {
		b := &batchBench{}
		fs := newFlagSet("batch", io.Discard)
		b.flags(fs, &shared{})
		require.NoError(t, fs.parse([]string{"-window", w}))
		yaml := "credentials:\n  - { name: d, provider: anthropic, base_url: http://127.0.0.1:1, api_key_env: K, batch: " + b.batchYAML() + " }\n"
		_, err := config.Parse([]byte(yaml), func(k string) string {
			return map[string]string{"K": "k"}[k]
		})
		require.NoError(t, err, "-window %s", w)
	}
	for _, w := range []string{"1s", "500ms", "25h"} {
		b := &batchBench{}
		fs := newFlagSet("batch", io.Discard)
		b.flags(fs, &shared{})
		require.ErrorContains(t, fs.parse([]string{"-window", w}), "-window: must be more than 1s", "-window %s", w)
	}
}
