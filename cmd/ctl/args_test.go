package main

import (
	"encoding/json"
	"io"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestFlagsFirst(t *testing.T) {
	t.Parallel()
	app := newApp(io.Discard, io.Discard).cli
	for name, tc := range map[string]struct{ in, want string }{
		"BoolAfterID":        {"jobs show ID --json", "jobs show --json ID"},
		"AlreadyFirst":       {"jobs show --json ID", "jobs show --json ID"},
		"RootFlagsStay":      {"--config c.yaml jobs show ID --json", "--config c.yaml jobs show --json ID"},
		"ValueAfterName":     {"tenants create batch --credentials default,backup", "tenants create --credentials default,backup batch"},
		"ValueWithEquals":    {"tenants create batch --credentials=a,b", "tenants create --credentials=a,b batch"},
		"SingleDash":         {"tenants create batch -credentials a", "tenants create -credentials a batch"},
		"ManyIDs":            {"dead retry A B --json", "dead retry --json A B"},
		"ValueLooksLikeFlag": {"dead list --reason --json", "dead list --reason --json"},
		"FlagsOnly":          {"dead list --reason r --since 24h --limit 5", "dead list --reason r --since 24h --limit 5"},
		"MissingValue":       {"dead list --reason", "dead list --reason"},
		"DoubleDash":         {"jobs show ID -- --json", "jobs show -- ID --json"},
		"DoubleDashFirst":    {"jobs show -- -x", "jobs show -- -x"},
		"UnknownCommand":     {"bogus --x y", "bogus --x y"},
		"UnknownSubcommand":  {"jobs bogus --json", "jobs bogus --json"},
		"Help":               {"help jobs", "help jobs"},
		"HelpFlagAfter":      {"jobs show ID --help", "jobs show --help ID"},
		"Empty":              {"", ""},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			got := flagsFirst(app, append([]string{"ctl"}, strings.Fields(tc.in)...))
			require.Equal(t, append([]string{"ctl"}, strings.Fields(tc.want)...), got)
		})
	}
	require.Empty(t, flagsFirst(app, nil))
}

// TestFlagsAfterArguments runs commands as the README writes them, flags last.
func TestFlagsAfterArguments(t *testing.T) {
	t.Parallel()
	b := setupJobs(t)
	job := b.createJob(t)

	r := run(t, "--database-url", b.url, "jobs", "show", job.ID, "--json")
	require.Equal(t, 0, r.code, "stderr %q", r.errOut)
	var got struct {
		Job struct {
			ID string `json:"id"`
		} `json:"job"`
	}
	require.NoError(t, json.Unmarshal([]byte(r.out), &got), "output %q", r.out)
	require.Equal(t, job.ID, got.Job.ID)

	// After "--" a flag-like argument is an ID, not a flag.
	requireOneLineError(t, run(t, "--database-url", b.url, "jobs", "show", "--", "--json"), 1, `no job "--json"`)
	// Still one ID only: a flag after it is not a second ID, but a second ID is.
	requireOneLineError(t, run(t, "--database-url", b.url, "jobs", "show", job.ID, "--json", "x"), 2, "usage")
}
