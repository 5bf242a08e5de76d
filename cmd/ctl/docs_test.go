package main

import (
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/urfave/cli/v2"
)

// TestDocs_CommandsExist holds the ctl command lines of the README and of the documents an
// operator reads (docs/operations.md, docs/api.md, docs/configuration.md) to ctl: in their code
// (backquotes and code blocks), each `ctl A B --flag` names commands ctl has, down to one without
// subcommands, and flags that command (or ctl itself) takes.
func TestDocs_CommandsExist(t *testing.T) {
	t.Parallel()
	cliMu.Lock() // as every run: urfave/cli keeps some state in package variables
	app := newApp(io.Discard, io.Discard).cli
	cliMu.Unlock()
	code := regexp.MustCompile("(?s)```[a-z]*\n.*?```|`[^`\n]+`")
	line := regexp.MustCompile(`\bctl((?: +[^ ;#|)` + "`" + `]+)+)`)
	seen := 0
	for _, doc := range []string{"README.md", "docs/operations.md", "docs/api.md", "docs/configuration.md"} {
		md, err := os.ReadFile(filepath.Join("..", "..", doc))
		require.NoError(t, err)
		for _, span := range code.FindAllString(string(md), -1) {
			for _, l := range strings.Split(span, "\n") {
				for _, m := range line.FindAllStringSubmatch(l, -1) {
					if err := checkCommandLine(app, strings.Fields(m[1])); err != "" {
						t.Errorf("%s: `ctl%s`: %s", doc, m[1], err)
					}
					seen++
				}
			}
		}
	}
	require.Greater(t, seen, 10, "the docs' ctl lines were not found")
}

// checkCommandLine follows args (a ctl command line without "ctl") down app's commands and
// returns what is wrong with it, or "".
func checkCommandLine(app *cli.App, args []string) string {
	flags := slices.Clone(app.Flags)
	cmds := app.Commands
	var cmd *cli.Command
	for len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		if args[0] == "help" { // added by urfave/cli to every command with subcommands
			return ""
		}
		next := findCommand(cmds, args[0])
		if next == nil {
			if cmd == nil || len(cmd.Subcommands) > 0 {
				return "no command " + args[0]
			}
			break // the command's arguments
		}
		cmd, cmds, args = next, next.Subcommands, args[1:]
	}
	if cmd == nil {
		return "no command"
	}
	// A group runs none of its own (its action is a usage error); a command with subcommands
	// and flags of its own (`ctl batch files`) runs itself too.
	if len(cmd.Subcommands) > 0 && len(cmd.Flags) == 0 {
		return cmd.Name + " needs one of its commands"
	}
	flags = append(flags, cmd.Flags...)
	for _, a := range args {
		name, ok := strings.CutPrefix(a, "--")
		if !ok {
			continue
		}
		name, _, _ = strings.Cut(name, "=")
		if !slices.ContainsFunc(flags, func(f cli.Flag) bool { return slices.Contains(f.Names(), name) }) {
			return cmd.Name + " has no flag --" + name
		}
	}
	return ""
}
