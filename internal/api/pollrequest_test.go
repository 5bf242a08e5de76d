package api

import (
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestGet_ReadsNoRequest: a poll reads the job without its request (as a cancel's read of it
// does), which the job JSON does not carry: each poll of a job submitted with a 4 MB body read
// those 4 MB from Postgres (0.2 to 0.34 s a poll, 0.005 to 0.03 s for a small one), and a client
// polls a job many times. (An event stream's lookup reads it: whether the job streams is in its
// request.)
func TestGet_ReadsNoRequest(t *testing.T) {
	t.Parallel()
	queries := &queryCounter{sqls: make(chan string, 100)}
	b := setup(t, setupOpts{noListener: true, queries: queries})
	job := b.create(t, "")
	for len(queries.sqls) > 0 {
		<-queries.sqls // the submit's
	}

	r := b.do(t, http.MethodGet, "/v1/jobs/"+job.ID, "", nil)
	require.Equal(t, http.StatusOK, r.status, "%v", r.body)
	reads := 0
	for len(queries.sqls) > 0 {
		sql := <-queries.sqls
		if strings.Contains(sql, "FROM jobs WHERE id = $1") {
			reads++
			require.Contains(t, sql, "NULL::json AS request", "the poll's read of its job")
		}
	}
	require.Positive(t, reads, "the poll read its job")
}
