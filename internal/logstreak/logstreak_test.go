package logstreak_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/logstreak"
)

// A run of failures logs its first and the success that ends it; a run after that logs again;
// once ctx has ended nothing is logged.
func TestNew_LogsARunOnce(t *testing.T) {
	t.Parallel()
	var logs bytes.Buffer
	ctx, cancel := context.WithCancel(context.Background())
	report := logstreak.New(ctx, slog.New(slog.NewTextHandler(&logs, nil)), "refresh")
	down := errors.New("down")

	report(nil) // no run: nothing
	for range 5 {
		report(down)
	}
	report(nil)
	report(nil)
	report(down)
	cancel()
	report(nil) // a shutdown's outcome: nothing

	lines := strings.Split(strings.TrimSpace(logs.String()), "\n")
	require.Len(t, lines, 3, logs.String())
	require.Contains(t, lines[0], `level=WARN msg="refresh failed; further errors are not logged until it succeeds" error=down`)
	require.Contains(t, lines[1], `level=INFO msg="refresh succeeds again" failures=5`)
	require.Contains(t, lines[2], `level=WARN msg="refresh failed;`)
}
