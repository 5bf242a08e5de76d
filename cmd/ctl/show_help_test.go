package main

import (
	"io"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/urfave/cli/v2"
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

// urfave/cli reads a backquoted word of a flag's help text as the name of the flag's value: the
// help of `ctl tenants revoke` showed `--cancel-jobs dead retry`, as if the switch took a value,
// and the text lost its quotes. No switch of any command shows a value's name.
func TestSwitchHelp_ShowsNoValue(t *testing.T) {
	t.Parallel()
	cliMu.Lock()
	app := newApp(io.Discard, io.Discard).cli
	cliMu.Unlock()
	var walk func(path string, flags []cli.Flag, cmds []*cli.Command)
	walk = func(path string, flags []cli.Flag, cmds []*cli.Command) {
		for _, f := range flags {
			d, ok := f.(cli.DocGenerationFlag)
			if !ok || d.TakesValue() {
				continue
			}
			// "--cancel-jobs, -c\tusage": the names, then a tab; a value's name would follow them.
			names, _, _ := strings.Cut(f.String(), "\t")
			require.NotContains(t, strings.ReplaceAll(names, ", ", ","), " ",
				"%s --%s: its help shows a value: %q", path, f.Names()[0], f.String())
		}
		for _, c := range cmds {
			walk(path+" "+c.Name, c.Flags, c.Subcommands)
		}
	}
	walk("ctl", app.Flags, app.Commands)

	r, _ := runApp(30*time.Second, nil, "tenants", "revoke", "--help")
	require.Equal(t, 0, r.code, r.errOut)
	require.Contains(t, r.out, "--cancel-jobs  ", r.out)
	require.Contains(t, r.out, "'ctl dead retry'", r.out)
}
