package config_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/config"
)

func TestParse_StreamingDefaults(t *testing.T) {
	t.Parallel()
	cfg, err := config.Parse(minimal(goodCred, ""), secretEnv)
	require.NoError(t, err)
	require.Equal(t, config.Streaming{BufferMaxEntries: 10000, BufferTTL: 10 * time.Minute}, cfg.Streaming)

	cfg, err = config.Parse(minimal(goodCred, "streaming: { buffer_max_entries: 500, buffer_ttl: 30s, delta_spacing: 40ms }\n"), secretEnv)
	require.NoError(t, err)
	require.Equal(t, config.Streaming{BufferMaxEntries: 500, BufferTTL: 30 * time.Second, DeltaSpacing: 40 * time.Millisecond}, cfg.Streaming)
}

func TestParse_StreamingValidation(t *testing.T) {
	t.Parallel()
	for doc, field := range map[string]string{
		"streaming: { buffer_max_entries: -1 }\n":      "streaming.buffer_max_entries",
		"streaming: { buffer_max_entries: 99 }\n":      "streaming.buffer_max_entries",
		"streaming: { buffer_max_entries: 1000001 }\n": "streaming.buffer_max_entries",
		"streaming: { buffer_ttl: -1s }\n":             "streaming.buffer_ttl",
		"streaming: { buffer_ttl: 999ms }\n":           "streaming.buffer_ttl",
		"streaming: { buffer_ttl: 25h }\n":             "streaming.buffer_ttl",
		"streaming: { buffer_size: 5 }\n":              "buffer_size",
		"streaming: { delta_spacing: -1ms }\n":         "streaming.delta_spacing",
		"streaming: { delta_spacing: 1001ms }\n":       "streaming.delta_spacing",
	} {
		_, err := config.Parse(minimal(goodCred, doc), secretEnv)
		require.ErrorContains(t, err, field, doc)
	}
}
