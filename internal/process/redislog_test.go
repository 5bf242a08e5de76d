package process_test

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/logtest"
	"github.com/llmq/llmq/internal/process"
)

// go-redis's own lines (a failed dial while Redis is down) reach the process's logger as JSON
// warnings, not stderr's plain text beside them.
func TestRedisLog_IsAWarningOfTheProcessLogger(t *testing.T) {
	t.Parallel()
	logs := &logtest.Buffer{}
	process.NewRedisLog(logs, "worker").Printf(context.Background(),
		"redis: failed to dial after %d attempts: %v", 5, "connection refused")
	var line map[string]any
	require.NoError(t, json.Unmarshal([]byte(logs.String()), &line), "one JSON line: %s", logs)
	require.Equal(t, "WARN", line["level"])
	require.Equal(t, "redis client", line["msg"])
	require.Equal(t, "worker", line["process"])
	require.Equal(t, "redis: failed to dial after 5 attempts: connection refused", line["message"])
}
