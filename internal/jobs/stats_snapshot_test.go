package jobs_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/jobs"
	"github.com/llmq/llmq/internal/jobstest"
)

// afterFirstJobsRead runs f once, when the first statement that reads the jobs table has ended.
type afterFirstJobsRead struct {
	once sync.Once
	f    func()
}

type statementKey struct{}

func (a *afterFirstJobsRead) TraceQueryStart(
	ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData,
) context.Context {
	return context.WithValue(ctx, statementKey{}, d.SQL)
}

func (a *afterFirstJobsRead) TraceQueryEnd(
	ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryEndData,
) {
	if sql, _ := ctx.Value(statementKey{}).(string); strings.Contains(sql, "FROM jobs") {
		a.once.Do(a.f)
	}
}

// TestStore_StatsIsOneSnapshot: a job that succeeds while the stats are read is counted
// everywhere or nowhere. Read in three statements, a success committed after the counts by
// status was a success (with its attempt) that no status counted: succeeded 0 beside 1 success.
func TestStore_StatsIsOneSnapshot(t *testing.T) {
	t.Parallel()
	b := jobstest.New(t)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	job := b.Create(t, jobstest.Opts{})
	cfg := b.Pool.Config()
	succeeded := false
	hook := &afterFirstJobsRead{f: func() {
		b.Attempt(t, job.ID, jobs.Outcome{Status: jobs.StatusSucceeded})
		succeeded = true
	}}
	cfg.ConnConfig.Tracer = hook
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	defer pool.Close()

	st, err := jobs.NewStore(pool, nil).Stats(ctx, time.Hour)
	require.NoError(t, err)
	require.True(t, succeeded, "the job succeeded while the stats were read")
	require.Equal(t, 1, st.ByStatus[jobs.StatusQueued]+st.ByStatus[jobs.StatusSucceeded], "%+v", st)
	require.Equal(t, st.ByStatus[jobs.StatusSucceeded], st.Succeeded, "%+v", st)
	require.Equal(t, st.Succeeded, st.Attempts, "%+v", st)
}
