package e2e_test

import (
	"os"
	"path/filepath"
	"regexp"
	"testing"

	"github.com/stretchr/testify/require"
	"gopkg.in/yaml.v3"
)

// TestRunLocal_ConfigSaysOnlyWhatServeUses: `make run` runs configs/local.yaml with `llmq serve`,
// which serves the worker's metrics on the API's /metrics and ignores worker.metrics_listen (it
// warns only when the setting is not its default). The file named 127.0.0.1:9091, the default:
// a port a reader of the file expected metrics on, where nothing listened, and no warning said so.
func TestRunLocal_ConfigSaysOnlyWhatServeUses(t *testing.T) {
	t.Parallel()
	script, err := os.ReadFile(filepath.Join(repoRoot, "scripts", "run-local.sh"))
	require.NoError(t, err)
	require.Regexp(t, regexp.MustCompile(`(?m)^bin/llmq serve --config configs/local\.yaml`), string(script),
		"make run serves configs/local.yaml with llmq serve")

	raw, err := os.ReadFile(filepath.Join(repoRoot, "configs", "local.yaml"))
	require.NoError(t, err)
	var cfg struct {
		Worker map[string]any `yaml:"worker"`
	}
	require.NoError(t, yaml.Unmarshal(raw, &cfg))
	require.NotContains(t, cfg.Worker, "metrics_listen",
		"llmq serve ignores worker.metrics_listen: its metrics are on the API's /metrics")
}
