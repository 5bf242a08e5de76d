package console_test

import (
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/jobs"
)

// TestBadInput_EmptyLimit: a list's limit given empty is refused (400 invalid_limit), as any
// other limit it cannot read is. It read as no limit given: the default page, answered as if
// the value asked had been read.
func TestBadInput_EmptyLimit(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := b.login(t)
	for _, path := range []string{"/console/api/jobs?limit=", "/console/api/dead?limit="} {
		r, out := c.do(http.MethodGet, path, nil, nil)
		requireError(t, r, out, http.StatusBadRequest, "invalid_limit")
		require.Contains(t, out, `limit \"\"`, "names the value read")
	}
}

// TestCSRF_RepeatedHeaderRefused: an action carrying X-CSRF-Token more than once is refused (403
// csrf, naming the repeat), whatever the values, and does nothing. The first was read and the
// others ignored: a header a proxy or script appended to was accepted by what came first.
func TestCSRF_RepeatedHeaderRefused(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := b.login(t)
	queued := b.jobs.Create(t, jobstestOpts())
	for _, values := range [][]string{{c.csrf, c.csrf}, {c.csrf, "x"}} {
		res, body := c.do(http.MethodPost, "/console/api/jobs/"+queued.ID+"/cancel", nil,
			http.Header{"X-Csrf-Token": values})
		requireError(t, res, body, http.StatusForbidden, "csrf")
		require.Contains(t, body, "2 times", "names the repeat")
	}
	job, err := b.jobs.Store.Get(t.Context(), queued.ID)
	require.NoError(t, err)
	require.Equal(t, jobs.StatusQueued, job.Status, "nothing was done")
}
