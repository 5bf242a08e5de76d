package process_test

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/config"
	"github.com/llmq/llmq/internal/process"
)

// TestProcesses_ADatabaseURLWithoutDatabaseNamesTheSetting: a database URL that names no
// database stops a process at start naming the setting the user wrote: database_url in the
// file, or LLMQ_DATABASE_URL when that overrode it. It said "the database url".
func TestProcesses_ADatabaseURLWithoutDatabaseNamesTheSetting(t *testing.T) {
	t.Parallel()
	const noDatabase = "postgres://postgres@127.0.0.1:1?sslmode=disable"
	path := filepath.Join(t.TempDir(), "llmq.yaml")
	require.NoError(t, os.WriteFile(path, []byte("database_url: "+noDatabase+"\nredis_url: redis://127.0.0.1:1\n"+
		"api: { listen: \"127.0.0.1:0\" }\nworker: { metrics_listen: \"off\" }\n"+
		"credentials:\n  - { name: default, provider: anthropic, base_url: \"http://127.0.0.1:1\", api_key_env: SIM_KEY }\n"), 0o600))
	for name, run := range map[string]func(context.Context, []string, process.Options) error{
		"API": process.API, "Worker": process.Worker, "Serve": process.Serve,
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			err := run(ctx, []string{"--config", path}, process.Options{Stderr: io.Discard, Getenv: getenv})
			require.ErrorContains(t, err, "database_url names no database")
			env := func(k string) string {
				if k == config.EnvDatabaseURL {
					return noDatabase
				}
				return getenv(k)
			}
			err = run(ctx, []string{"--config", path}, process.Options{Stderr: io.Discard, Getenv: env})
			require.ErrorContains(t, err, config.EnvDatabaseURL+" names no database")
		})
	}
}
