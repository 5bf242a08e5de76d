package main

import (
	"encoding/json"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/audit"
)

// TestAudit_PagesWithBefore: `ctl audit --before ID` goes on from a page's last entry (its id
// in --json), as the console's audit page does, so that a script reads the whole log a page at
// a time; an id below 1 is a usage error. ctl could read only the newest --limit entries.
func TestAudit_PagesWithBefore(t *testing.T) {
	t.Parallel()
	b := setupJobs(t)
	url := b.url
	for _, action := range []string{"a.first", "a.second", "a.third"} {
		_, err := audit.Log(t.Context(), b.pool, audit.Entry{Operator: "alice", Action: action})
		require.NoError(t, err)
	}
	page := func(args ...string) []audit.Entry {
		r := run(t, append([]string{"--database-url", url, "audit", "--json", "--limit", "2"}, args...)...)
		require.Equal(t, 0, r.code, r.errOut)
		var entries []audit.Entry
		require.NoError(t, json.Unmarshal([]byte(r.out), &entries))
		return entries
	}
	actions := func(entries []audit.Entry) (out []string) {
		for _, e := range entries {
			out = append(out, e.Action)
		}
		return out
	}
	first := page()
	require.Equal(t, []string{"a.third", "a.second"}, actions(first))
	require.Equal(t, []string{"a.first"}, actions(page("--before", strconv.FormatInt(first[1].ID, 10))))

	for _, bad := range []string{"0", "-3"} {
		requireOneLineError(t, run(t, "--database-url", url, "audit", "--before", bad), 2, "--before must be an entry's id")
	}
}
