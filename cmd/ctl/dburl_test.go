package main

import (
	"testing"

	"github.com/llmq/llmq/internal/config"
)

// noDatabaseURL names no database, and its user is postgres: refused by migrations.ParseConfig.
const noDatabaseURL = "postgres://postgres@127.0.0.1:1?sslmode=disable"

// TestDatabaseURLWithoutDatabase_NamesTheSetting: a database URL that names no database is
// refused (exit 2, one line) naming where it came from, --database-url or the config file's
// database_url, for a command on the pool and for migrate; it said "the database url".
func TestDatabaseURLWithoutDatabase_NamesTheSetting(t *testing.T) {
	t.Parallel()
	cfgFile := configFile(t, noDatabaseURL, "main", "anthropic")
	for _, cmd := range [][]string{{"tenants", "list"}, {"migrate"}} {
		requireOneLineError(t, run(t, append([]string{"--database-url", noDatabaseURL}, cmd...)...), 2,
			"--database-url names no database")
		requireOneLineError(t, run(t, append([]string{"--config", cfgFile}, cmd...)...), 2,
			"database_url (in the config file) names no database")
	}
}

// TestDatabaseURLWithoutDatabase_NamesTheVariable: from LLMQ_DATABASE_URL, the variable is named.
// Not parallel: it sets the variable.
func TestDatabaseURLWithoutDatabase_NamesTheVariable(t *testing.T) {
	t.Setenv(config.EnvDatabaseURL, noDatabaseURL)
	for _, cmd := range [][]string{{"tenants", "list"}, {"migrate"}} {
		requireOneLineError(t, run(t, cmd...), 2, config.EnvDatabaseURL+" names no database")
	}
}
