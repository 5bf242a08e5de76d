package main

import (
	"bytes"
	"context"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/pgtest"
)

// lockedBuffer is a bytes.Buffer safe to read while ctl writes it.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestMigrate_SaysWhoHoldsTheMigrationLock runs `ctl migrate` while another session holds the
// migration lock (a long migration of a process starting elsewhere): instead of waiting in
// silence, which an operator cannot tell from a hang, it says on the error output that it waits,
// and for whom; once the lock is let go it migrates and succeeds.
func TestMigrate_SaysWhoHoldsTheMigrationLock(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dbURL := pgtest.URL(t)
	cfg, err := pgx.ParseConfig(dbURL)
	require.NoError(t, err)
	cfg.RuntimeParams["application_name"] = "llmq-worker-migrating"
	holder, err := pgx.ConnectConfig(ctx, cfg)
	require.NoError(t, err)
	defer holder.Close(context.Background())
	var pid int
	require.NoError(t, holder.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid))
	_, err = holder.Exec(ctx, "SELECT pg_advisory_lock($1)", int64(0x6c6c6d716d696772))
	require.NoError(t, err)

	errOut := &lockedBuffer{}
	done := make(chan result, 1)
	go func() {
		// --timeout, which bounds every other command's statements, does not bound migrate's wait.
		r, _ := runApp(45*time.Second, func(a *app) { a.errOut = errOut }, "--database-url", dbURL, "--timeout", "100ms", "migrate")
		done <- r
	}()
	want := "held by pid " + strconv.Itoa(pid)
	for !strings.Contains(errOut.String(), want) {
		select {
		case r := <-done:
			t.Fatalf("migrate returned while another session held the lock: %+v, stderr %q", r, errOut.String())
		case <-ctx.Done():
			t.Fatalf("migrate did not say it waits for pid %d; stderr %q", pid, errOut.String())
		case <-time.After(20 * time.Millisecond):
		}
	}
	line := strings.SplitN(errOut.String(), "\n", 2)[0]
	require.Contains(t, line, "waiting")
	require.Contains(t, line, "migration lock")
	require.Contains(t, line, `application "llmq-worker-migrating"`)

	_, err = holder.Exec(ctx, "SELECT pg_advisory_unlock($1)", int64(0x6c6c6d716d696772))
	require.NoError(t, err)
	select {
	case r := <-done:
		require.Equal(t, 0, r.code, "stderr %q", errOut.String())
		require.Equal(t, "schema is up to date\n", r.out)
	case <-ctx.Done():
		t.Fatal("migrate did not finish once the lock was let go")
	}
}
