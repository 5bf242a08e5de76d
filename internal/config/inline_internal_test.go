package config

import (
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// untaggedOrInline lists the fields of t's blocks (t and the struct types its fields hold,
// through pointers, slices and maps) that the file's key suggestions (blockKeys) and the
// whole-number walk (wholeNumbers) would skip: an exported field without a yaml name (yaml.v3
// reads it under its lower-cased Go name) or with ",inline" (its keys are its parent's).
func untaggedOrInline(t reflect.Type) []string {
	var bad []string
	seen := map[reflect.Type]bool{}
	var walk func(t reflect.Type)
	walk = func(t reflect.Type) {
		for t.Kind() == reflect.Pointer || t.Kind() == reflect.Slice || t.Kind() == reflect.Map {
			t = t.Elem()
		}
		if t.Kind() != reflect.Struct || seen[t] {
			return
		}
		seen[t] = true
		for f := range t.Fields() {
			if !f.IsExported() {
				continue
			}
			name, opts, _ := strings.Cut(f.Tag.Get("yaml"), ",")
			if name == "-" {
				continue
			}
			if name == "" || slices.Contains(strings.Split(opts, ","), "inline") {
				bad = append(bad, t.String()+"."+f.Name)
				continue
			}
			walk(f.Type)
		}
	}
	walk(t)
	return bad
}

// TestConfig_NoInlineOrUntaggedFields guards blockKeys and wholeNumbers, which read each block's
// keys from its fields' yaml names and know neither ",inline" nor a field without a name:
// adding one to Config's types fails here rather than leave its keys unchecked (a misspelling
// of them unsuggested, a 2.5 in an integer of them truncated).
func TestConfig_NoInlineOrUntaggedFields(t *testing.T) {
	t.Parallel()
	require.Empty(t, untaggedOrInline(reflect.TypeFor[Config]()),
		"teach blockKeys and wholeNumbers these fields' keys, or give them yaml names")

	// The guard sees both kinds, however deep.
	type inner struct {
		A int `yaml:"a"`
	}
	type block struct {
		Inline   inner `yaml:",inline"`
		Untagged int
		Named    *inner `yaml:"named"`
		Skipped  int    `yaml:"-"`
	}
	type root struct {
		Blocks []block `yaml:"blocks"`
	}
	require.ElementsMatch(t, []string{"config.block.Inline", "config.block.Untagged"},
		untaggedOrInline(reflect.TypeFor[root]()))
}
