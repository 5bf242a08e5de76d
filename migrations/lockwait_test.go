package migrations_test

import (
	"context"
	"net/url"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/pgtest"
	"github.com/llmq/llmq/migrations"
)

// migrationLockKey is the migrations' advisory lock ("llmqmigr").
const migrationLockKey int64 = 0x6c6c6d716d696772

// holdMigrationLock takes the migration lock of the database at dbURL on a session of its own,
// named application, as another process migrating would; release lets it go.
func holdMigrationLock(ctx context.Context, t *testing.T, dbURL, application string) (pid int, release func()) {
	t.Helper()
	cfg, err := pgx.ParseConfig(dbURL)
	require.NoError(t, err)
	cfg.RuntimeParams["application_name"] = application
	holder, err := pgx.ConnectConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = holder.Close(context.Background()) })
	require.NoError(t, holder.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid))
	_, err = holder.Exec(ctx, "SELECT pg_advisory_lock($1)", migrationLockKey)
	require.NoError(t, err)
	return pid, func() {
		_, err := holder.Exec(ctx, "SELECT pg_advisory_unlock($1)", migrationLockKey)
		require.NoError(t, err)
	}
}

// TestUpWatch_ReportsWhoHoldsTheLock runs Up while another session holds the migration lock (a
// long migration elsewhere): it waits, and says so again and again, naming the holder, until the
// lock is let go; then it migrates and reports no more.
func TestUpWatch_ReportsWhoHoldsTheLock(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool := pgtest.Pool(t)
	dbURL := pool.Config().ConnString()
	holderPID, release := holdMigrationLock(ctx, t, dbURL, "llmq-test-lock-holder")

	reports := make(chan migrations.LockWait, 100)
	done := make(chan error, 1)
	returned := make(chan struct{})
	go func() {
		defer close(returned)
		_, err := migrations.UpWatch(ctx, pool, migrations.LockWatch{
			Report: func(w migrations.LockWait) { reports <- w },
			First:  10 * time.Millisecond, Every: 10 * time.Millisecond,
		})
		done <- err
	}()
	for i := range 2 {
		select {
		case w := <-reports:
			require.NoError(t, w.Err)
			require.NotNil(t, w.Holder, "report %d: %s", i, w)
			require.Equal(t, holderPID, w.Holder.PID)
			require.Equal(t, "llmq-test-lock-holder", w.Holder.Application)
			require.Contains(t, w.String(), "held by pid")
			require.Contains(t, w.String(), `application "llmq-test-lock-holder"`)
		case err := <-done:
			t.Fatalf("Up returned while another session held the lock: %v", err)
		case <-ctx.Done():
			t.Fatal("the wait was not reported")
		}
	}
	release()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-ctx.Done():
		t.Fatal("Up did not take the let-go lock")
	}
	<-returned
	// No report after Up returned: drain what came before, then none may come.
	for len(reports) > 0 {
		<-reports
	}
	select {
	case w := <-reports:
		t.Fatalf("reported after Up returned: %s", w)
	default:
	}
}

// TestUpWatch_UncontendedIsSilent: with the lock free, Up reports nothing, however soon a report
// is due.
func TestUpWatch_UncontendedIsSilent(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, err := migrations.UpWatch(ctx, pgtest.Pool(t), migrations.LockWatch{
		Report: func(w migrations.LockWait) { t.Errorf("reported an uncontended lock: %s", w) },
		First:  time.Nanosecond, Every: time.Nanosecond,
	})
	require.NoError(t, err)
}

// TestOpenWaitWatch_ReportsTheWait: a process starting while another migrates (OpenWaitWatch,
// what api and worker use) reports the wait too, and opens once the lock is let go.
func TestOpenWaitWatch_ReportsTheWait(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dbURL := pgtest.URL(t)
	u, err := url.Parse(dbURL)
	require.NoError(t, err)
	require.NotEmpty(t, u.Path)
	holderPID, release := holdMigrationLock(ctx, t, dbURL, "llmq-test-open-holder")

	reports := make(chan migrations.LockWait, 100)
	opened := make(chan error, 1)
	go func() {
		p, err := migrations.OpenWaitWatch(ctx, dbURL, func(err error, _ time.Duration) {
			t.Errorf("retried: %v", err)
		}, migrations.LockWatch{Report: func(w migrations.LockWait) { reports <- w }, First: 10 * time.Millisecond})
		if p != nil {
			p.Close()
		}
		opened <- err
	}()
	select {
	case w := <-reports:
		require.NotNil(t, w.Holder, "%s", w)
		require.Equal(t, holderPID, w.Holder.PID)
	case err := <-opened:
		t.Fatalf("OpenWaitWatch returned while another session held the lock: %v", err)
	case <-ctx.Done():
		t.Fatal("the wait was not reported")
	}
	release()
	select {
	case err := <-opened:
		require.NoError(t, err)
	case <-ctx.Done():
		t.Fatal("OpenWaitWatch did not return")
	}
}
