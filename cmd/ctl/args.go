package main

import (
	"slices"
	"strings"

	"github.com/urfave/cli/v2"
)

// flagsFirst lets flags follow positional arguments (`ctl jobs show ID --json`), as the usage
// lines and the README write them: urfave/cli v2 stops parsing a command's flags at its first
// positional argument and would take `--json` for a second ID. Level by level, it moves each
// command's flags (with their values) ahead of that command's positional arguments, so the
// parser finds them where it looks. A flag takes the next argument as its value when the flag
// takes a value and is not written `--name=value`, as Go's flag package reads it. "--" ends the
// flags: what follows it stays positional (and stays after a "--"). A level whose first
// positional argument names no command is left as written, so unknown commands and `help` keep
// their errors and help. args[0] is the program name.
func flagsFirst(app *cli.App, args []string) []string {
	if len(args) == 0 {
		return args
	}
	return append([]string{args[0]}, flagsFirstLevel(app.Flags, app.Commands, args[1:])...)
}

func flagsFirstLevel(flags []cli.Flag, cmds []*cli.Command, args []string) []string {
	takesValue := valueFlags(flags)
	var flagArgs, positional []string
	for i := 0; i < len(args); i++ {
		a := args[i]
		switch {
		case a == "--":
			if len(cmds) > 0 {
				return append(flagArgs, args[i:]...)
			}
			out := append(flagArgs, "--")
			out = append(out, positional...)
			return append(out, args[i+1:]...)
		case len(a) > 1 && a[0] == '-':
			flagArgs = append(flagArgs, a)
			name, _, hasValue := strings.Cut(strings.TrimLeft(a, "-"), "=")
			if !hasValue && takesValue[name] && i+1 < len(args) {
				i++
				flagArgs = append(flagArgs, args[i])
			}
		case len(cmds) > 0:
			if cmd := findCommand(cmds, a); cmd != nil {
				return append(append(flagArgs, a), flagsFirstLevel(cmd.Flags, cmd.Subcommands, args[i+1:])...)
			}
			return append(flagArgs, args[i:]...)
		default:
			positional = append(positional, a)
		}
	}
	return append(flagArgs, positional...)
}

// valueFlags returns the names (aliases included) of the flags that take a value.
func valueFlags(flags []cli.Flag) map[string]bool {
	m := map[string]bool{}
	for _, f := range flags {
		v, ok := f.(interface{ TakesValue() bool })
		if !ok || !v.TakesValue() {
			continue
		}
		for _, n := range f.Names() {
			m[n] = true
		}
	}
	return m
}

func findCommand(cmds []*cli.Command, name string) *cli.Command {
	for _, c := range cmds {
		if c.Name == name || slices.Contains(c.Aliases, name) {
			return c
		}
	}
	return nil
}
