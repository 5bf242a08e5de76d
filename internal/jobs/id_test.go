package jobs_test

import (
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/jobs"
	"github.com/llmq/llmq/internal/jobstest"
)

// TestStore_IDFormsUUIDParseAcceptsAreNotFound: uuid.Parse accepts a job's ID with the urn:uuid:
// prefix, in braces or without hyphens; Postgres refuses the first (an error, a 500 at the API),
// so every store call that takes an ID treats them all as naming no job.
func TestStore_IDFormsUUIDParseAcceptsAreNotFound(t *testing.T) {
	t.Parallel()
	b := jobstest.New(t)
	ctx := context.Background()
	job := b.Create(t, jobstest.Opts{})

	for name, id := range map[string]string{
		"URN":       "urn:uuid:" + job.ID,
		"URNUpper":  "URN:UUID:" + job.ID,
		"Braces":    "{" + job.ID + "}",
		"NoHyphens": strings.ReplaceAll(job.ID, "-", ""),
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			_, err := b.Store.Get(ctx, id)
			require.ErrorIs(t, err, jobs.ErrNotFound)
			evs, err := b.Store.Events(ctx, id, 0)
			require.NoError(t, err)
			require.Empty(t, evs)
			_, err = b.Store.Cancel(ctx, id)
			require.ErrorIs(t, err, jobs.ErrNotFound)
			u, err := b.Store.UnfinishedByID(ctx, []string{id, job.ID})
			require.NoError(t, err)
			require.Len(t, u, 1, "the well-formed ID alone")
		})
	}
	t.Run("UpperCaseIsTheSameJob", func(t *testing.T) {
		t.Parallel()
		got, err := b.Store.Get(ctx, strings.ToUpper(job.ID))
		require.NoError(t, err)
		require.Equal(t, job.ID, got.ID)
	})
}
