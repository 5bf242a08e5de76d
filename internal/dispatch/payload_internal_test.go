package dispatch

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestJobIDOf: a task's body is the bare job ID; a due task's, and a task's that an earlier
// version enqueued, {"job_id": ...}, are delivered to their job too.
func TestJobIDOf(t *testing.T) {
	t.Parallel()
	const id = "0190a5b2-7c1e-7d3f-9a8b-123456789abc"
	for name, body := range map[string]string{"Bare": id, "Legacy": `{"job_id":"` + id + `"}`,
		"Due": `{"job_id":"` + id + `","deferred":"rate limit slot"}`} {
		got, err := jobIDOf([]byte(body))
		require.NoError(t, err, name)
		require.Equal(t, id, got, name)
	}
	_, err := jobIDOf([]byte(`{"job_id":`))
	require.Error(t, err, "a broken legacy body is an error, not an empty job ID")
}
