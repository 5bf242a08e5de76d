package main

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestExitCodes_InputTheStoresRefuseIsAUsageError: input the user got wrong that only the
// stores check (a name's form, a weight's range, a credential listed twice, a name taken, in
// any case) exits 2 with one line naming the problem, as a command line ctl refuses does; it
// exited 1, as a failure of Postgres does, which still exits 1.
func TestExitCodes_InputTheStoresRefuseIsAUsageError(t *testing.T) {
	t.Parallel()
	b := setupJobs(t)
	db := []string{"--database-url", b.url}
	tenants := append(db[:len(db):len(db)], "tenants")
	operators := append(db[:len(db):len(db)], "operators")
	r := run(t, append(tenants, "create", "acme")...)
	require.Equal(t, 0, r.code, r.errOut)
	r = run(t, append(operators, "create", "alice")...)
	require.Equal(t, 0, r.code, r.errOut)

	for _, c := range []struct {
		args []string
		want string
	}{
		{append(tenants, "create", "bad name"), `invalid name: tenant "bad name" must be 1-64 letters`},
		{append(tenants, "create", "x", "--weight", "0"), "invalid weight: 0 (want 1..1000)"},
		{append(tenants, "create", "x", "--credentials", "a,a"), `credential listed twice: "a"`},
		{append(tenants, "create", "x", "--credentials", "a,bad name"), `invalid name: credential "bad name"`},
		{append(tenants, "create", "acme"), `tenant exists: "acme"`},
		{append(tenants, "create", "ACME"), `tenant exists: "ACME" differs from tenant "acme" only in case`},
		{append(tenants, "set", "acme", "--weight", "0"), "invalid weight: 0 (want 1..1000)"},
		{append(tenants, "set", "acme", "--weight", "1001"), "invalid weight: 1001 (want 1..1000)"},
		{append(operators, "create", "bad name"), `invalid operator name: "bad name"`},
		{append(operators, "create", "alice"), `operator exists: "alice"`},
	} {
		requireOneLineError(t, run(t, c.args...), 2, c.want)
	}

	// Postgres failing is the system's failure: exit 1 still.
	for _, args := range [][]string{{"tenants", "create", "acme"}, {"tenants", "set", "acme", "--weight", "0"},
		{"operators", "create", "alice"}} {
		requireOneLineError(t, run(t, append([]string{"--database-url", unreachableURL}, args...)...), 1,
			"postgres unreachable")
	}
}
