package redisscript_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/redisscript"
)

// Call ids are unique: within one client's, and between two clients' (two processes).
func TestCallIDs_Unique(t *testing.T) {
	t.Parallel()
	a, b := redisscript.NewCallIDs(), redisscript.NewCallIDs()
	seen := map[string]bool{}
	for range 1000 {
		for _, id := range []string{a.Next(), b.Next()} {
			require.False(t, seen[id], "id %s given twice", id)
			require.NotContains(t, id, " ", "an id is one script argument word")
			seen[id] = true
		}
	}
}
