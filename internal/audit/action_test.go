package audit_test

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/audit"
	"github.com/llmq/llmq/internal/pgtest"
)

// TestListPage_FiltersByActionWithinTheScanBound: a page filtered by action holds only those
// actions, newest first; it reads at most PageScanRows entries past its cursor, so a page whose
// window holds fewer matches than its limit comes back short (here with the two newest matches)
// and a Next that goes on from the last entry read, where the next page finds the older ones. A
// name no entry can have is ErrUnknownAction, naming the known ones.
func TestListPage_FiltersByActionWithinTheScanBound(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	ctx := context.Background()
	for i := range 3 {
		_, err := audit.Log(ctx, pool, audit.Entry{Operator: "alice", Action: "dead.purge", Count: i})
		require.NoError(t, err)
	}
	// More logins than one page reads, between the purges and the creates.
	_, err := pool.Exec(ctx, `INSERT INTO audit_log (operator, action, target, count)
SELECT 'bob', 'login', '', 1 FROM generate_series(1, $1)`, audit.PageScanRows)
	require.NoError(t, err)
	for i := range 2 {
		_, err := audit.Log(ctx, pool, audit.Entry{Operator: "alice", Action: "tenant.create", Count: 10 + i})
		require.NoError(t, err)
	}

	p := audit.ListParams{Actions: []string{"dead.purge", "tenant.create"}, Limit: 10}
	page, err := audit.ListPage(ctx, pool, p)
	require.NoError(t, err)
	require.Equal(t, []int{11, 10}, counts(page.Entries), "the creates, found within the bound")
	require.NotEmpty(t, page.Next, "the read stopped at the bound: a next page goes on")
	next, err := strconv.ParseInt(page.Next, 10, 64)
	require.NoError(t, err)
	var below int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM audit_log WHERE id < $1`, next).Scan(&below))
	require.Equal(t, 5, below, "the page read PageScanRows entries: two logins and the purges are left")

	p.After = page.Next
	page, err = audit.ListPage(ctx, pool, p)
	require.NoError(t, err)
	require.Equal(t, []int{2, 1, 0}, counts(page.Entries))
	require.Empty(t, page.Next, "the log's end")

	page, err = audit.ListPage(ctx, pool, audit.ListParams{Actions: []string{"dead.purge"}, Operator: "bob"})
	require.NoError(t, err)
	require.Empty(t, page.Entries, "both filters hold")

	_, err = audit.ListPage(ctx, pool, audit.ListParams{Actions: []string{"dead.purge", "dead.purged"}})
	require.ErrorIs(t, err, audit.ErrUnknownAction)
	require.ErrorContains(t, err, `"dead.purged"`)
	require.ErrorContains(t, err, "dead.purge, dead.retry")
}

func counts(es []audit.Entry) []int {
	out := []int{}
	for _, e := range es {
		out = append(out, e.Count)
	}
	return out
}

// TestActions_NameEveryActionWritten: every action name the code writes to the log (an
// `Action: "x"` or `action: "x"` literal in the repository's Go files) is one of Actions, which
// the action filters of ctl audit and the console offer and check: a new action left out of
// Actions could not be filtered on.
func TestActions_NameEveryActionWritten(t *testing.T) {
	t.Parallel()
	literal := regexp.MustCompile(`(?:Action|action): +"([a-z_]+\.?[a-z_]*)"`)
	written := map[string]bool{}
	root := filepath.Join("..", "..")
	for _, dir := range []string{"cmd", "internal"} {
		require.NoError(t, filepath.WalkDir(filepath.Join(root, dir), func(path string, d os.DirEntry, err error) error {
			if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
				return err
			}
			b, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			for _, m := range literal.FindAllStringSubmatch(string(b), -1) {
				written[m[1]] = true
			}
			return nil
		}))
	}
	require.NotEmpty(t, written)
	for a := range written {
		require.True(t, slices.Contains(audit.Actions(), a), "action %q is written but not in audit.Actions", a)
	}
	require.True(t, slices.IsSorted(audit.Actions()))
}
