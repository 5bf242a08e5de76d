package process_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/logtest"
	"github.com/llmq/llmq/internal/process"
	"github.com/llmq/llmq/internal/redistest"
)

// A Postgres that accepts connections and never answers (a hung server, a partition after the
// handshake) does not hang a starting process for ever without a word: each try to connect
// ends at the default connect_timeout, and the process logs that it waits for Postgres, and
// goes on trying until its context ends.
func TestAPI_SilentPostgresAtStartIsLoggedAndTriedAgain(t *testing.T) {
	silent, _ := redistest.Stalled(t) // a plain TCP listener that accepts and reads for ever
	yaml := fmt.Sprintf(`
database_url: postgres://postgres@%s/llmq_silent?sslmode=disable
redis_url: %s
api: { listen: "127.0.0.1:0", allow_anonymous: true }
credentials:
  - { name: default, provider: anthropic, base_url: "http://127.0.0.1:1", api_key_env: SIM_KEY }
`, silent, redistest.Server(t))
	path := filepath.Join(t.TempDir(), "llmq.yaml")
	require.NoError(t, os.WriteFile(path, []byte(yaml), 0o600))

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	logs := &logtest.Buffer{}
	done := make(chan error, 1)
	go func() {
		done <- process.API(ctx, []string{"--config", path}, process.Options{Stderr: logs, Getenv: getenv})
	}()

	deadline := time.Now().Add(20 * time.Second)
	for logs.Count("postgres not reachable yet") == 0 {
		select {
		case err := <-done:
			t.Fatalf("the process ended before it logged the wait: %v", err)
		default:
		}
		require.True(t, time.Now().Before(deadline),
			"20 s on a silent Postgres and the process has logged nothing: %s", logs.String())
		time.Sleep(50 * time.Millisecond)
	}
	require.Contains(t, logs.String(), "timeout", "the line says the connection timed out")
	cancel()
	select {
	case err := <-done:
		require.Error(t, err)
	case <-time.After(30 * time.Second):
		t.Fatal("the process did not stop 30 s after its context ended")
	}
}
