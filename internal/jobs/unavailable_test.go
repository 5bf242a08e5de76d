package jobs_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/jobs"
	"github.com/llmq/llmq/internal/jobstest"
)

func TestIsUnavailable(t *testing.T) {
	t.Parallel()
	ctx := t.Context()

	t.Run("Classified", func(t *testing.T) {
		t.Parallel()
		opErr := &net.OpError{Op: "read", Net: "tcp", Err: errors.New("connection reset by peer")}
		for _, tc := range []struct {
			name string
			err  error
			want bool
		}{
			{"nil", nil, false},
			{"plain", errors.New("boom"), false},
			{"constraint", &pgconn.PgError{Code: "23505"}, false},
			{"syntax", &pgconn.PgError{Code: "42601"}, false},
			{"admin shutdown", fmt.Errorf("q: %w", &pgconn.PgError{Code: "57P01"}), true},
			{"too many connections", &pgconn.PgError{Code: "53300"}, true},
			{"connection failure", &pgconn.PgError{Code: "08006"}, true},
			{"reset", fmt.Errorf("q: %w", opErr), true},
			{"eof", fmt.Errorf("q: %w", io.ErrUnexpectedEOF), true},
			{"closed", fmt.Errorf("q: %w", net.ErrClosed), true},
			{"pgconn closed", fmt.Errorf("create job: %w", pgconn.ErrConnClosed), true},
		} {
			require.Equal(t, tc.want, jobs.IsUnavailable(tc.err), tc.name)
		}
	})

	t.Run("RefusedConnect", func(t *testing.T) {
		t.Parallel()
		l, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		addr := l.Addr().String()
		require.NoError(t, l.Close())
		_, err = pgx.Connect(ctx, "postgres://postgres@"+addr+"/x?sslmode=disable&connect_timeout=5")
		require.Error(t, err)
		require.True(t, jobs.IsUnavailable(err), "%v", err)
	})

	t.Run("BackendTerminated", func(t *testing.T) {
		t.Parallel()
		// What a Postgres restart does to a pooled connection: the next query on it fails.
		b := jobstest.New(t)
		conn, err := pgx.Connect(ctx, b.URL)
		require.NoError(t, err)
		defer conn.Close(context.Background())
		var pid int
		require.NoError(t, conn.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid))
		_, err = b.Pool.Exec(ctx, "SELECT pg_terminate_backend($1)", pid)
		require.NoError(t, err)
		_, err = conn.Exec(ctx, "SELECT 1")
		require.Error(t, err)
		require.True(t, jobs.IsUnavailable(err), "%v", err)
	})
}
