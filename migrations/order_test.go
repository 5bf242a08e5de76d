package migrations_test

import (
	"fmt"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/pgtest"
	"github.com/llmq/llmq/migrations"
)

// TestUp_RefusesAMigrationNumberedBelowTheNewestApplied: a migration added with a number below
// one a database has applied already (into the gap at 014, or a branch's 021 merged after
// another 021..023 shipped) would run there after the newer ones, against a schema its author
// never saw, and on a fresh database before them: two orders. Up refuses it, naming it and the
// newest applied version, and applies nothing.
func TestUp_RefusesAMigrationNumberedBelowTheNewestApplied(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := pgtest.Pool(t) // migrated to the newest
	all := migrations.All()
	newest := all[len(all)-1].Version
	late := migrations.Migration{Version: 14, Name: "late", Up: "CREATE TABLE late_014 (id int)"}
	ms := slices.Clone(all)
	i, _ := slices.BinarySearchFunc(ms, late.Version, func(m migrations.Migration, v int) int { return m.Version - v })
	ms = slices.Insert(ms, i, late)

	done, err := migrations.UpWith(ctx, pool, migrations.LockWatch{}, ms)
	require.ErrorContains(t, err, "014_late")
	// The operator who meets it learns that nothing was applied and what to deploy.
	require.ErrorContains(t, err, "nothing was applied")
	require.ErrorContains(t, err, fmt.Sprintf("deploy a build whose new migrations are numbered above %03d", newest))
	require.Empty(t, done)
	var exists bool
	require.NoError(t, pool.QueryRow(ctx, "SELECT to_regclass('late_014') IS NOT NULL").Scan(&exists))
	require.False(t, exists, "nothing applied")

	// Numbered above the newest, it applies.
	late.Version = newest + 1
	done, err = migrations.UpWith(ctx, pool, migrations.LockWatch{}, append(slices.Clone(all), late))
	require.NoError(t, err)
	require.Equal(t, []int{newest + 1}, done)
}

// TestAll_VersionsAreUnique: two files of one number would both be applied on a fresh database
// (the second failing on schema_migrations' key only after its statements ran) and their order
// would be their names'.
func TestAll_VersionsAreUnique(t *testing.T) {
	t.Parallel()
	all := migrations.All()
	for i := 1; i < len(all); i++ {
		require.Less(t, all[i-1].Version, all[i].Version, "%03d_%s and %03d_%s", all[i-1].Version, all[i-1].Name, all[i].Version, all[i].Name)
	}
}
