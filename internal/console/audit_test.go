package console_test

import (
	"context"
	"net/http"
	"net/url"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/audit"
)

// auditPage is an answer of GET /console/api/audit.
type auditPage struct {
	Entries []audit.Entry `json:"entries"`
	Limit   int           `json:"limit"`
	Next    string        `json:"next"`
	// Actions are the action names the filter takes; ScanRows, the most entries a page with
	// the filter reads.
	Actions  []string `json:"actions"`
	ScanRows int      `json:"scan_rows"`
}

// TestAuditList_PagesAndFilters: the audit log is listed a page at a time, newest first, each
// page going on from the previous one's "next" until the last's "" (older entries were out of
// reach: only the latest 100 were shown), and filtered by operator as ctl audit --operator.
func TestAuditList_PagesAndFilters(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := b.login(t) // alice's login is the oldest entry
	ctx := context.Background()
	for i := range 4 {
		op := "ctl:root"
		if i%2 == 1 {
			op = "bob"
		}
		_, err := audit.Log(ctx, b.jobs.Pool, audit.Entry{Operator: op, Action: "tenant.create", Count: i + 1})
		require.NoError(t, err)
	}

	var got []int
	var p auditPage
	c.json(http.MethodGet, "/console/api/audit?limit=2", nil, &p)
	for {
		require.Equal(t, 2, p.Limit)
		for _, e := range p.Entries {
			got = append(got, e.Count)
		}
		if p.Next == "" {
			break
		}
		require.Less(t, len(got), 5, "a last page")
		next := p.Next
		p = auditPage{}
		c.json(http.MethodGet, "/console/api/audit?limit=2&after="+url.QueryEscape(next), nil, &p)
	}
	require.Equal(t, []int{4, 3, 2, 1, 1}, got, "the four entries newest first, then the login")

	p = auditPage{}
	c.json(http.MethodGet, "/console/api/audit", nil, &p)
	require.Len(t, p.Entries, 5)
	require.Equal(t, 100, p.Limit, "the default page")
	require.Empty(t, p.Next)

	p = auditPage{}
	c.json(http.MethodGet, "/console/api/audit?operator=bob", nil, &p)
	require.Len(t, p.Entries, 2)
	for _, e := range p.Entries {
		require.Equal(t, "bob", e.Operator)
	}
}

// TestAuditList_BadParameters: the audit list refuses what it cannot read as the other lists
// do: an unknown or repeated parameter (it ignored every parameter, so ?action=login answered the
// whole log as if filtered), a garbled cursor, a limit out of range, a filter Postgres cannot hold.
func TestAuditList_BadParameters(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := b.login(t)
	for _, tc := range []struct {
		path, typ, says string
	}{
		{"/console/api/audit?actions=login", "invalid_parameter", `unknown parameter \"actions\"`},
		{"/console/api/audit?action=dead.purged", "invalid_filter", `unknown audit action \"dead.purged\": the actions are batch_file.forget,`},
		{"/console/api/audit?action=login,,logout", "invalid_filter", `unknown audit action \"\"`},
		{"/console/api/audit?operator=a&operator=b", "invalid_parameter", `\"operator\" is given 2 times`},
		{"/console/api/audit?after=garbage", "stale_page", "stale or malformed"},
		{"/console/api/audit?after=0", "stale_page", "stale or malformed"},
		{"/console/api/audit?limit=501", "invalid_limit", "from 1 to 500"},
		{"/console/api/audit?limit=", "invalid_limit", `limit \"\"`},
		{"/console/api/audit?operator=a%00b", "invalid_filter", "operator must be UTF-8"},
	} {
		r, out := c.do(http.MethodGet, tc.path, nil, nil)
		requireError(t, r, out, http.StatusBadRequest, tc.typ)
		require.Contains(t, out, tc.says, tc.path)
	}
}

// TestAuditList_FiltersByAction: ?action= (one name or a comma list, ctl audit --action's) keeps
// those actions' entries, with the operator filter too, and says the known actions in its answer
// for the page's select.
func TestAuditList_FiltersByAction(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := b.login(t) // a login entry
	ctx := context.Background()
	for i, a := range []string{"tenant.create", "dead.purge", "tenant.create", "dead.retry"} {
		_, err := audit.Log(ctx, b.jobs.Pool, audit.Entry{Operator: "bob", Action: a, Count: i})
		require.NoError(t, err)
	}
	var p auditPage
	c.json(http.MethodGet, "/console/api/audit?action=tenant.create,dead.purge", nil, &p)
	require.Equal(t, []int{2, 1, 0}, auditCounts(p.Entries))
	require.Empty(t, p.Next)
	p = auditPage{}
	c.json(http.MethodGet, "/console/api/audit?action=login&operator=bob", nil, &p)
	require.Empty(t, p.Entries)
	p = auditPage{}
	c.json(http.MethodGet, "/console/api/audit?action=login", nil, &p)
	require.Len(t, p.Entries, 1)
	require.Equal(t, "login", p.Entries[0].Action)
	require.Equal(t, audit.Actions(), p.Actions, "the known actions, for the page's select")
	require.Equal(t, audit.PageScanRows, p.ScanRows)
}

func auditCounts(es []audit.Entry) []int {
	out := []int{}
	for _, e := range es {
		out = append(out, e.Count)
	}
	return out
}
