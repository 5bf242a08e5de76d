package offboard_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/llmq/llmq/internal/audit"
	"github.com/llmq/llmq/internal/jobs"
	"github.com/llmq/llmq/internal/jobstest"
	"github.com/llmq/llmq/internal/offboard"
	"github.com/llmq/llmq/internal/pgtest"
	"github.com/llmq/llmq/internal/tenant"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// pgxpool's background health check ends after the test's pool.Close.
		goleak.IgnoreTopFunction("internal/poll.runtime_pollWait"),
	)
}

// revoked makes tenant name and revokes it; its jobs are made with jobstest.Opts{Tenant: name}.
func revoked(t *testing.T, b *jobstest.Bundle, name string) *tenant.Store {
	t.Helper()
	tenants := tenant.NewStore(b.Pool, nil)
	_, _, err := tenants.Create(t.Context(), name, nil)
	require.NoError(t, err)
	_, err = tenants.Revoke(t.Context(), name)
	require.NoError(t, err)
	return tenants
}

func statusOf(t *testing.T, b *jobstest.Bundle, id string) jobs.Status {
	t.Helper()
	j, err := b.Store.Get(t.Context(), id)
	require.NoError(t, err)
	return j.Status
}

// TestCancelJobs: a revoked tenant's waiting jobs and dead letters are canceled and each is
// given to abort; another tenant's are left alone; the audit entry counts the dead letters.
func TestCancelJobs(t *testing.T) {
	t.Parallel()
	b := jobstest.New(t)
	tenants := revoked(t, b, "gone")
	waiting := b.Create(t, jobstest.Opts{Tenant: "gone"})
	dead := b.Dead(t, jobstest.Opts{Tenant: "gone"}, jobs.ReasonRetriesExhausted, 1)
	other := b.Dead(t, jobstest.Opts{}, jobs.ReasonRetriesExhausted, 1)

	var aborted []string
	n, nDead, err := offboard.CancelJobs(t.Context(), tenants, b.Store, "gone", 0, func(j *jobs.Job) error {
		aborted = append(aborted, j.ID)
		return nil
	}, nil)
	require.NoError(t, err)
	require.Equal(t, 2, n)
	require.Equal(t, 1, nDead)
	require.ElementsMatch(t, []string{waiting.ID, dead.ID}, aborted)
	require.Equal(t, jobs.StatusCanceled, statusOf(t, b, waiting.ID))
	require.Equal(t, jobs.StatusCanceled, statusOf(t, b, dead.ID))
	require.Equal(t, jobs.StatusDead, statusOf(t, b, other.ID))
	require.Equal(t, audit.Entry{Action: "tenant.cancel_jobs", Target: "gone", Count: 2,
		Detail: map[string]any{"dead_letters": 1}}, offboard.CancelJobsEntry("gone", n, nDead))

	_, _, err = offboard.CancelJobs(t.Context(), tenants, b.Store, "nobody", 0, nil, nil)
	require.ErrorIs(t, err, tenant.ErrNotFound)
	_, _, err = tenants.Create(t.Context(), "live", nil)
	require.NoError(t, err)
	_, _, err = offboard.CancelJobs(t.Context(), tenants, b.Store, "live", 0, nil, nil)
	require.ErrorIs(t, err, tenant.ErrNotRevoked)
}

// TestDeleteTenant_AnAbortThatFailsStopsBeforeTheDeletion: when a canceled job's task cannot be
// aborted (Redis down), nothing is deleted, as an attempt may still be in flight; the error
// says so and the Result counts the cancels for the audit. A second run deletes the tenant.
func TestDeleteTenant_AnAbortThatFailsStopsBeforeTheDeletion(t *testing.T) {
	t.Parallel()
	b := jobstest.New(t)
	tenants := revoked(t, b, "gone")
	waiting := b.Create(t, jobstest.Opts{Tenant: "gone"})
	dead := b.Dead(t, jobstest.Opts{Tenant: "gone"}, jobs.ReasonRetriesExhausted, 1)
	other := b.Create(t, jobstest.Opts{})

	redisDown := errors.New("redis down")
	res, err := offboard.DeleteTenant(t.Context(), tenants, b.Store, "gone", offboard.Options{
		Abort: func(*jobs.Job) error { return redisDown },
	})
	require.ErrorIs(t, err, redisDown)
	require.Equal(t, offboard.Result{Canceled: 1}, res)
	require.Equal(t, []audit.Entry{{Action: "tenant.cancel_jobs", Target: "gone", Count: 1}}, res.AuditEntries("gone"))
	require.Equal(t, jobs.StatusCanceled, statusOf(t, b, waiting.ID))
	require.Equal(t, jobs.StatusDead, statusOf(t, b, dead.ID), "not deleted")
	_, err = tenants.RevokedFor(t.Context(), "gone")
	require.NoError(t, err, "the tenant is kept")

	var progress []int64
	res, err = offboard.DeleteTenant(t.Context(), tenants, b.Store, "gone", offboard.Options{
		Batch: 1, Progress: func(n int64) { progress = append(progress, n) },
	})
	require.NoError(t, err)
	require.Equal(t, offboard.Result{Deleted: 2, TenantDeleted: true}, res)
	require.Equal(t, []int64{1, 2}, progress, "told after each full batch")
	require.Equal(t, []audit.Entry{{Action: "tenant.delete", Target: "gone", Count: 1,
		Detail: map[string]any{"jobs_deleted": int64(2)}}}, res.AuditEntries("gone"))
	for _, id := range []string{waiting.ID, dead.ID} {
		_, err := b.Store.Get(t.Context(), id)
		require.ErrorIs(t, err, jobs.ErrNotFound)
	}
	require.Equal(t, jobs.StatusQueued, statusOf(t, b, other.ID), "another tenant's job")
	_, err = tenants.RevokedFor(t.Context(), "gone")
	require.ErrorIs(t, err, tenant.ErrNotFound)

	_, err = offboard.DeleteTenant(t.Context(), tenants, b.Store, tenant.Default, offboard.Options{})
	require.ErrorIs(t, err, tenant.ErrAnonymousTenant)
}

// TestCancelJobs_DeadLettersAlsoWhenAnAbortFailed: when a canceled job's task cannot be aborted
// (Redis down), the tenant's dead letters are canceled all the same, and the error names both
// passes' failures. The dead-letter pass was skipped: the dead letters stayed for a retry of
// every dead letter to send again, until the operator ran the command again.
func TestCancelJobs_DeadLettersAlsoWhenAnAbortFailed(t *testing.T) {
	t.Parallel()
	b := jobstest.New(t)
	tenants := revoked(t, b, "gone")
	waiting := b.Create(t, jobstest.Opts{Tenant: "gone"})
	dead := b.Dead(t, jobstest.Opts{Tenant: "gone"}, jobs.ReasonRetriesExhausted, 1)

	redisDown := errors.New("redis down")
	n, nDead, err := offboard.CancelJobs(t.Context(), tenants, b.Store, "gone", 0, func(*jobs.Job) error { return redisDown }, nil)
	require.ErrorIs(t, err, redisDown)
	require.Equal(t, jobs.StatusCanceled, statusOf(t, b, waiting.ID))
	require.Equal(t, jobs.StatusCanceled, statusOf(t, b, dead.ID), "the dead letter, after the failed abort")
	require.Equal(t, 2, n)
	require.Equal(t, 1, nDead)
	require.Contains(t, err.Error(), "1 canceled jobs' tasks could not be aborted")
	require.Contains(t, err.Error(), "1 canceled dead jobs' tasks could not be aborted")
	require.NotErrorIs(t, err, offboard.ErrIncomplete, "every job is canceled: a later run aborts nothing more")
}

// TestCancelJobs_InterruptedSaysSoOnce: interrupted (Ctrl-C: CancelTenant returns ctx.Err()
// while it waits for the revocation to settle), CancelJobs does not go on to the dead letters,
// whose pass could only fail alike: the error says "context canceled" once, it is marked
// ErrIncomplete (a later call cancels the rest), and the dead letter is left for it. The pass ran
// with the canceled context, and the joined error said "context canceled" twice.
func TestCancelJobs_InterruptedSaysSoOnce(t *testing.T) {
	t.Parallel()
	b := jobstest.New(t)
	tenants := revoked(t, b, "gone")
	waiting := b.Create(t, jobstest.Opts{Tenant: "gone"})
	dead := b.Dead(t, jobstest.Opts{Tenant: "gone"}, jobs.ReasonRetriesExhausted, 1)

	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	// The first walk cancels the waiting job; the operator's Ctrl-C comes during the settle.
	n, nDead, err := offboard.CancelJobs(ctx, tenants, b.Store, "gone", time.Hour, func(*jobs.Job) error {
		cancel()
		return nil
	}, nil)
	require.ErrorIs(t, err, context.Canceled)
	require.Equal(t, 1, strings.Count(err.Error(), "context canceled"), "said once: %q", err)
	require.ErrorIs(t, err, offboard.ErrIncomplete)
	require.Equal(t, 1, n)
	require.Zero(t, nDead)
	require.Equal(t, jobs.StatusCanceled, statusOf(t, b, waiting.ID))
	require.Equal(t, jobs.StatusDead, statusOf(t, b, dead.ID), "left for the next run")

	n, nDead, err = offboard.CancelJobs(t.Context(), tenants, b.Store, "gone", 0, nil, nil)
	require.NoError(t, err)
	require.Equal(t, 1, n, "the next run cancels the rest")
	require.Equal(t, 1, nDead)
}

// TestCancelJobs_OnePostgresFailureSaidOnce: with Postgres unreachable, both passes (the jobs
// not ended, the dead letters) fail on the same failure; the error says it once, and says the
// dead letters' pass failed too. It said the whole failure twice (errors.Join), on one line of
// ctl's: a wall of text for one refused connection.
func TestCancelJobs_OnePostgresFailureSaidOnce(t *testing.T) {
	t.Parallel()
	b := jobstest.New(t)
	tenants := revoked(t, b, "gone")
	proxy, proxied := pgtest.NewProxy(t, b.URL)
	pool, err := pgxpool.New(t.Context(), proxied)
	require.NoError(t, err)
	defer pool.Close()
	proxy.Cut()

	_, _, err = offboard.CancelJobs(t.Context(), tenants, jobs.NewStore(pool, nil), "gone", 0, nil, nil)
	require.ErrorIs(t, err, offboard.ErrIncomplete)
	require.Equal(t, 1, strings.Count(err.Error(), "failed to connect"), "said once: %q", err)
	require.Contains(t, err.Error(), "dead letters")
	require.NotContains(t, err.Error(), "\n", "one failure, one line")
}

// TestCancelJobs_TwoDifferentFailuresSaidBoth: when the two passes stop on two different failures
// of Postgres (here the jobs' pass on a statement timeout, the dead letters' on a full disk, both
// "unavailable"), the error names both: one of them is not "alike". Merged as one failure, the
// disk full was never said.
func TestCancelJobs_TwoDifferentFailuresSaidBoth(t *testing.T) {
	t.Parallel()
	b := jobstest.New(t)
	tenants := revoked(t, b, "gone")
	b.Create(t, jobstest.Opts{Tenant: "gone"})
	b.Dead(t, jobstest.Opts{Tenant: "gone"}, jobs.ReasonRetriesExhausted, 1)
	_, err := b.Pool.Exec(t.Context(), `CREATE FUNCTION fail_cancel() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	IF OLD.status = 'dead' THEN
		RAISE EXCEPTION 'could not extend file: No space left on device' USING ERRCODE = '53100';
	END IF;
	RAISE EXCEPTION 'canceling statement due to statement timeout' USING ERRCODE = '57014';
END $$;
CREATE TRIGGER fail_cancel BEFORE UPDATE ON jobs FOR EACH ROW EXECUTE FUNCTION fail_cancel();`)
	require.NoError(t, err)

	_, _, err = offboard.CancelJobs(t.Context(), tenants, b.Store, "gone", 0, nil, nil)
	require.ErrorIs(t, err, offboard.ErrIncomplete)
	require.Contains(t, err.Error(), "statement timeout")
	require.Contains(t, err.Error(), "No space left on device", "the second failure is said too")
}

// TestCancelJobs_RerunAbortsTheCanceledJobsInFlight: a run whose page of cancels committed
// without its answer (here: a job canceled, its task not aborted) left an attempt in flight. The
// rerun aborts it through abortInFlight, counting it nowhere (abort is not told of it, n is 0);
// a canceled job with no attempt in flight is not aborted. So does a deletion. The rerun
// aborted nothing (every job was canceled already).
func TestCancelJobs_RerunAbortsTheCanceledJobsInFlight(t *testing.T) {
	t.Parallel()
	b := jobstest.New(t)
	tenants := revoked(t, b, "gone")
	running := b.Create(t, jobstest.Opts{Tenant: "gone"})
	_, err := b.Store.BeginAttempt(t.Context(), running.ID)
	require.NoError(t, err)
	waiting := b.Create(t, jobstest.Opts{Tenant: "gone"})
	for _, id := range []string{running.ID, waiting.ID} {
		_, err := b.Store.Cancel(t.Context(), id) // committed, its abort never made
		require.NoError(t, err)
	}

	var canceled, inFlight []string
	n, nDead, err := offboard.CancelJobs(t.Context(), tenants, b.Store, "gone", 0,
		func(j *jobs.Job) error { canceled = append(canceled, j.ID); return nil },
		func(j *jobs.Job) error { inFlight = append(inFlight, j.ID); return nil })
	require.NoError(t, err)
	require.Zero(t, n)
	require.Zero(t, nDead)
	require.Empty(t, canceled)
	require.Equal(t, []string{running.ID}, inFlight)

	redisDown := errors.New("redis down")
	res, err := offboard.DeleteTenant(t.Context(), tenants, b.Store, "gone", offboard.Options{
		AbortInFlight: func(*jobs.Job) error { return redisDown },
	})
	require.ErrorIs(t, err, redisDown, "a failed abort stops the deletion before it begins")
	require.Equal(t, offboard.Result{}, res)
	require.Equal(t, jobs.StatusCanceled, statusOf(t, b, running.ID), "not deleted")
}
