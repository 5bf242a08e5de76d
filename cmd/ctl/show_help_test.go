package main

import (
	"io"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// `ctl dead show` prints what `ctl jobs show` does (printJob: the job's usage row, each attempt's
// USAGE column), yet its help text said nothing of the usage while jobs show's did: an operator
// looking for a dead job's cost read no hint that dead show has it.
func TestShowHelp_BothSayUsage(t *testing.T) {
	t.Parallel()
	cliMu.Lock() // as every run: urfave/cli keeps some state in package variables
	app := newApp(io.Discard, io.Discard).cli
	cliMu.Unlock()
	for _, group := range []string{"jobs", "dead"} {
		g := findCommand(app.Commands, group)
		require.NotNil(t, g, group)
		show := findCommand(g.Subcommands, "show")
		require.NotNil(t, show, group+" show")
		require.Contains(t, strings.ToLower(show.Usage), "usage", "ctl %s show's help text: %q", group, show.Usage)
	}
}

// TestTimeoutHelp_SaysItBoundsTheWaitForAConnection: --timeout bounds each wait for a pool
// connection as well as each statement (statementBound is an AcquireTracer; README,
// docs/operations.md), yet its help text named the statements only.
func TestTimeoutHelp_SaysItBoundsTheWaitForAConnection(t *testing.T) {
	t.Parallel()
	r, _ := runApp(30*time.Second, nil, "--help")
	require.Equal(t, 0, r.code, r.errOut)
	var line string
	for _, l := range strings.Split(r.out, "\n") {
		if strings.Contains(l, "--timeout") {
			line = l
		}
	}
	require.Contains(t, line, "each Postgres statement of a command", r.out)
	require.Contains(t, line, "each wait for a connection", r.out)
	require.Contains(t, line, "not of migrate")
}
