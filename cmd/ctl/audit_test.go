package main

import (
	"encoding/json"
	"regexp"
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

// TestAudit_FiltersByAction: `ctl audit --action` (repeated, or a comma list) lists those
// actions' entries; a page whose read stopped at audit.PageScanRows entries short of --limit
// says so on the error output, with the --before that goes on, and that page finds the older
// ones. An action name no entry can have is a usage error naming the known ones.
func TestAudit_FiltersByAction(t *testing.T) {
	t.Parallel()
	b := setupJobs(t)
	log := func(action string) {
		_, err := audit.Log(t.Context(), b.pool, audit.Entry{Operator: "alice", Action: action})
		require.NoError(t, err)
	}
	log("dead.purge")
	_, err := b.pool.Exec(t.Context(), `INSERT INTO audit_log (operator, action, target, count)
SELECT 'bob', 'login', '', 1 FROM generate_series(1, $1)`, audit.PageScanRows)
	require.NoError(t, err)
	log("tenant.create")
	log("dead.retry")

	actions := func(out string) (got []string) {
		var entries []audit.Entry
		require.NoError(t, json.Unmarshal([]byte(out), &entries))
		for _, e := range entries {
			got = append(got, e.Action)
		}
		return got
	}
	db := []string{"--database-url", b.url, "audit"}
	for _, args := range [][]string{{"--action", "tenant.create", "--action", "dead.purge"}, {"--action", "tenant.create,dead.purge"}} {
		r := run(t, append(append(db, args...), "--json")...)
		require.Equal(t, 0, r.code, r.errOut)
		require.Equal(t, []string{"tenant.create"}, actions(r.out), "the purge is past the bound")
		require.Regexp(t, `^ctl: no more matching entries in the last 10000 read; older ones: --before \d+\n$`, r.errOut)
		before := regexp.MustCompile(`--before (\d+)`).FindStringSubmatch(r.errOut)[1]
		r = run(t, append(append(db, args...), "--json", "--before", before)...)
		require.Equal(t, 0, r.code, r.errOut)
		require.Equal(t, []string{"dead.purge"}, actions(r.out))
		require.Empty(t, r.errOut, "the log's end")
	}
	r := run(t, append(db, "--action", "dead.retry", "--limit", "1")...)
	require.Equal(t, 0, r.code, r.errOut)
	require.Contains(t, r.out, "dead.retry")
	require.Empty(t, r.errOut, "a full page, nothing to say")

	requireOneLineError(t, run(t, append(db, "--action", "dead.purged")...), 2,
		`unknown audit action "dead.purged": the actions are batch_file.forget, batch_file.retry,`)
}
