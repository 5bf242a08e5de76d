package config_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/config"
)

func TestParse_HTTPServerDefaults(t *testing.T) {
	t.Parallel()
	cfg, err := config.Parse(minimal(goodCred, ""), secretEnv)
	require.NoError(t, err)
	require.Equal(t, 30*time.Second, cfg.API.ReadTimeout)
	require.Equal(t, 30*time.Second, cfg.API.WriteTimeout)
	require.Equal(t, 60*time.Second, cfg.API.IdleTimeout)
	require.Equal(t, 10*time.Second, cfg.API.EventWriteTimeout)
	require.Zero(t, cfg.API.MaxConnections, "0: derived from the open-file limit when the server starts")
	require.Equal(t, 100, cfg.API.MaxStreamsPerTenant)
	require.Zero(t, cfg.API.MaxKeyedSubmitsPerTenant, "0: half the Postgres pool, when the API starts")
	require.Zero(t, cfg.API.MaxStreams, "0: half of max_connections, when the server starts")

	cfg, err = config.Parse(minimal(goodCred, `api: { read_timeout: 5s, write_timeout: 6s, idle_timeout: 7s, event_write_timeout: 8s,
  max_connections: 9, max_streams_per_tenant: 10, max_keyed_submits_per_tenant: 11, max_streams: 12 }
`), secretEnv)
	require.NoError(t, err)
	require.Equal(t, []any{5 * time.Second, 6 * time.Second, 7 * time.Second, 8 * time.Second, 9, 10, 11, 12},
		[]any{cfg.API.ReadTimeout, cfg.API.WriteTimeout, cfg.API.IdleTimeout, cfg.API.EventWriteTimeout,
			cfg.API.MaxConnections, cfg.API.MaxStreamsPerTenant, cfg.API.MaxKeyedSubmitsPerTenant, cfg.API.MaxStreams})
}

func TestParse_HTTPServerValidation(t *testing.T) {
	t.Parallel()
	for field, doc := range map[string]string{
		"api.read_timeout":                 "api: { read_timeout: -1s }\n",
		"api.write_timeout":                "api: { write_timeout: 1us }\n",
		"api.idle_timeout":                 "api: { idle_timeout: -5m }\n",
		"api.event_write_timeout":          "api: { event_write_timeout: -1ms }\n",
		"api.max_connections":              "api: { max_connections: -1 }\n",
		"api.max_streams_per_tenant":       "api: { max_streams_per_tenant: -3 }\n",
		"api.max_keyed_submits_per_tenant": "api: { max_keyed_submits_per_tenant: -1 }\n",
		"api.max_streams":                  "api: { max_streams: -4 }\n",
	} {
		_, err := config.Parse(minimal(goodCred, doc), secretEnv)
		require.ErrorContains(t, err, field+": must be", doc)
	}
}
