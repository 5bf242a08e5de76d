package main

import (
	"flag"
	"fmt"
	"io"
	"strings"
	"time"
)

// flagSet is a flag.FlagSet whose flags may carry a lower bound and whose scenario may add
// checks across flags; parse runs them all after parsing.
type flagSet struct {
	*flag.FlagSet
	checks []func() error
}

func newFlagSet(name string, usage io.Writer) *flagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(usage)
	return &flagSet{FlagSet: fs}
}

// check adds a check run after parsing, for rules across flags.
func (fs *flagSet) check(f func() error) { fs.checks = append(fs.checks, f) }

// parse parses flags only (a positional argument is an error), then runs the checks.
func (fs *flagSet) parse(args []string) error {
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments: %s", strings.Join(fs.Args(), " "))
	}
	for _, c := range fs.checks {
		if err := c(); err != nil {
			return err
		}
	}
	return nil
}

// bound adds the check that flag name's value *p is at least lo, or above it when strict.
func bound[T int | float64 | time.Duration](fs *flagSet, name string, p *T, lo T, strict bool) {
	fs.check(func() error {
		switch {
		case *p > lo || (!strict && *p == lo):
			return nil
		case lo == 0 && strict:
			return fmt.Errorf("-%s: must be positive", name)
		case lo == 0:
			return fmt.Errorf("-%s: must not be negative", name)
		case strict:
			return fmt.Errorf("-%s: must be more than %v", name, lo)
		}
		return fmt.Errorf("-%s: must be at least %v", name, lo)
	})
}

// intAtLeast defines an int flag whose value must be at least lo.
func (fs *flagSet) intAtLeast(p *int, name string, value, lo int, usage string) {
	fs.IntVar(p, name, value, usage)
	bound(fs, name, p, lo, false)
}

// floatAtLeast defines a float64 flag whose value must be at least lo.
func (fs *flagSet) floatAtLeast(p *float64, name string, value, lo float64, usage string) {
	fs.Float64Var(p, name, value, usage)
	bound(fs, name, p, lo, false)
}

// positiveFloat defines a float64 flag whose value must be more than 0.
func (fs *flagSet) positiveFloat(p *float64, name string, value float64, usage string) {
	fs.Float64Var(p, name, value, usage)
	bound(fs, name, p, 0, true)
}

// positiveDuration defines a duration flag whose value must be more than 0.
func (fs *flagSet) positiveDuration(p *time.Duration, name string, value time.Duration, usage string) {
	fs.DurationVar(p, name, value, usage)
	bound(fs, name, p, 0, true)
}

// durationAtLeast defines a duration flag whose value must be at least lo.
func (fs *flagSet) durationAtLeast(p *time.Duration, name string, value, lo time.Duration, usage string) {
	fs.DurationVar(p, name, value, usage)
	bound(fs, name, p, lo, false)
}
