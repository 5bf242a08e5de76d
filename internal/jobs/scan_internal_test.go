package jobs

import (
	"context"
	"encoding/json"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/pgtest"
)

// scanSetup returns a context with a deadline, a test database's pool, a store on it and a job
// created there (with a fallback, so that every column holds a value of its type).
func scanSetup(t *testing.T) (context.Context, *pgxpool.Pool, *Store, *Job) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	pool := pgtest.Pool(t)
	s := NewStore(pool, nil)
	created, _, err := s.Create(ctx, CreateParams{Tenant: "default", Credential: "c", Request: json.RawMessage(`{"model":"m"}`),
		MaxAttempts: 3, Timeout: time.Hour, Fallbacks: []string{"d"}})
	require.NoError(t, err)
	return ctx, pool, s, created
}

// TestScanJob_PlansKeptPerConnection: a connection's job rows are scanned with the plans its
// first row made; a column of another type in a later statement is planned again and read
// right; another connection gets plans of its own.
func TestScanJob_PlansKeptPerConnection(t *testing.T) {
	t.Parallel()
	ctx, pool, s, created := scanSetup(t)

	conn, err := pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	byID := `SELECT ` + jobColumns + ` FROM jobs WHERE id = $1`
	first, err := s.scanJob(conn.QueryRow(ctx, byID, created.ID))
	require.NoError(t, err)
	require.Equal(t, created, first)
	plans := s.plans.forMap(conn.Conn().TypeMap())
	made := append([]pgtype.ScanPlan(nil), plans.plans...)
	require.Len(t, made, 33)

	again, err := s.scanJob(conn.QueryRow(ctx, byID, created.ID))
	require.NoError(t, err)
	require.Equal(t, created, again)
	require.Equal(t, made, plans.plans, "the second row used the first row's plans")

	// attempts as bigint: that column alone is planned again, and read right.
	wide := strings.Replace(byID, " attempts,", " attempts::bigint + 2 AS attempts,", 1)
	require.NotEqual(t, byID, wide)
	bumped, err := s.scanJob(conn.QueryRow(ctx, wide, created.ID))
	require.NoError(t, err)
	require.Equal(t, created.Attempts+2, bumped.Attempts)
	require.Equal(t, uint32(pgtype.Int8OID), plans.oids[5])
	for i := range made {
		if i != 5 {
			require.Equal(t, made[i], plans.plans[i], "column %d", i)
		}
	}

	other, err := pool.Acquire(ctx)
	require.NoError(t, err)
	defer other.Release()
	require.NotSame(t, plans, s.plans.forMap(other.Conn().TypeMap()))
}

// TestScanPlans_DroppedWithTheirConnection: the plans of a connection whose type map is gone
// (a closed connection) are dropped, so that a pool's turnover does not grow them.
func TestScanPlans_DroppedWithTheirConnection(t *testing.T) {
	t.Parallel()
	var p scanPlans
	func() { p.forMap(pgtype.NewMap()) }()
	count := func() int {
		p.mu.Lock()
		defer p.mu.Unlock()
		return len(p.byMap)
	}
	require.Equal(t, 1, count())
	require.Eventually(t, func() bool {
		runtime.GC()
		return count() == 0
	}, 30*time.Second, 10*time.Millisecond)
}

// TestScanJob_ErrorsAndRowsWithoutConnection: a row that is not a job row is an error naming the
// column count; a column that cannot be read is pgx's ScanArgError naming it; rows read without
// a connection (no type map to keep plans for) are still scanned.
func TestScanJob_ErrorsAndRowsWithoutConnection(t *testing.T) {
	t.Parallel()
	ctx, pool, s, created := scanSetup(t)

	_, err := s.scanJob(pool.QueryRow(ctx, `SELECT 1`))
	require.ErrorContains(t, err, "scan job row: 1 columns, want 33")

	byID := `SELECT ` + jobColumns + ` FROM jobs WHERE id = $1`
	bad := strings.Replace(byID, " attempts,", " 'many' AS attempts,", 1)
	_, err = s.scanJob(pool.QueryRow(ctx, bad, created.ID))
	var argErr pgx.ScanArgError
	require.ErrorAs(t, err, &argErr)
	require.Equal(t, "attempts", argErr.FieldName)

	conn, err := pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	rr := conn.Conn().PgConn().ExecParams(ctx, byID, [][]byte{[]byte(created.ID)}, nil, nil, nil)
	rows := pgx.RowsFromResultReader(conn.Conn().TypeMap(), rr)
	defer rows.Close()
	require.True(t, rows.Next())
	require.Nil(t, rows.Conn())
	got, err := s.scanJob(rows)
	require.NoError(t, err)
	require.Equal(t, created.ID, got.ID)
	require.Equal(t, created.CreatedAt, got.CreatedAt)
	require.JSONEq(t, string(created.Request), string(got.Request))
}

// rowFunc is a pgx.RowScanner of a func.
type rowFunc func(pgx.Rows) error

// ScanRow implements pgx.RowScanner.
func (f rowFunc) ScanRow(rows pgx.Rows) error { return f(rows) }

// TestScanJob_Allocs pins scanJob's allocations beside its statement's: the row's values that
// pgx allocates (the strings, bytes, the fallbacks' slice and the overrides' int64s: 10 for this
// row), and one jobScan
// that holds the Job and what its pointer fields point to (the row is read as a succeeded job's,
// with both timeout overrides). Its destinations, the values converted after the scan, the
// scanner and Scan's argument were 10 more (20 beside the statement), the Job apart from its
// jobScan 1 more, and the cost class and the overrides 3 more, on every submit, poll and
// transition of a job.
func TestScanJob_Allocs(t *testing.T) { // not parallel: testing.AllocsPerRun
	if raceEnabled {
		t.Skip("the race detector's sync.Pool drops pgx's pooled buffers at random")
	}
	ctx, pool, s, _ := scanSetup(t)
	created, _, err := s.Create(ctx, CreateParams{Tenant: "default", Credential: "c", Request: json.RawMessage(`{"model":"m"}`),
		MaxAttempts: 3, Timeout: time.Hour, Fallbacks: []string{"d"}, AttemptTimeout: time.Minute,
		FirstByteTimeout: time.Second})
	require.NoError(t, err)
	conn, err := pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	byID := strings.Replace(`SELECT `+jobColumns+` FROM jobs WHERE id = $1`, " status,", " 'succeeded'::text AS status,", 1)
	got, err := s.scanJob(conn.QueryRow(ctx, byID, created.ID)) // the connection's plans made
	require.NoError(t, err)
	require.Equal(t, StatusSucceeded, got.Status)
	require.Equal(t, string(got.Lane), *got.CostClass)
	require.Equal(t, Duration(time.Minute), *got.AttemptTimeout)
	require.Equal(t, Duration(time.Second), *got.FirstByteTimeout)
	// The floor: the statement, its row read by a scanner that reads nothing.
	none := rowFunc(func(pgx.Rows) error { return nil })
	floor := testing.AllocsPerRun(100, func() {
		if err := conn.QueryRow(ctx, byID, created.ID).Scan(none); err != nil {
			panic(err)
		}
	})
	allocs := testing.AllocsPerRun(100, func() {
		if _, err := s.scanJob(conn.QueryRow(ctx, byID, created.ID)); err != nil {
			panic(err)
		}
	})
	t.Logf("scanJob: %.1f allocations, the statement alone %.1f", allocs, floor)
	require.LessOrEqual(t, allocs, floor+10+1, "allocations of scanJob and the row's values")
}

// TestGet_Allocs pins a poll's read (get, the worker's load) beside its statement run by the
// batcher with its arguments and scan made once: the job's ID boxed as its argument, 1 more
// (the statement's batchOp, its arguments' list, its scan and the Job's pointer are one
// jobQuery, where the floor makes a batchOp). The list, the scan's closure and the Job's
// pointer it wrote were 3 more, 4 in all.
func TestGet_Allocs(t *testing.T) { // not parallel: testing.AllocsPerRun
	if raceEnabled {
		t.Skip("the race detector's sync.Pool drops pgx's pooled buffers at random")
	}
	ctx, _, s, created := scanSetup(t)
	byID := `SELECT ` + jobColumns + ` FROM jobs WHERE id = $1`
	_, err := s.get(ctx, created.ID, byID) // a connection made, and idle, its plans made
	require.NoError(t, err)
	// The floor: the statement run by the batcher, its arguments and scan made once.
	args := []any{created.ID}
	var job *Job
	scan := func(r pgx.Row) (err error) {
		job, err = s.scanJob(r)
		return err
	}
	floor := testing.AllocsPerRun(100, func() {
		if err := s.batch.queryRow(ctx, created.ID, byID, args, scan); err != nil {
			panic(err)
		}
	})
	require.Equal(t, created.ID, job.ID)
	allocs := testing.AllocsPerRun(100, func() {
		if _, err := s.get(ctx, created.ID, byID); err != nil {
			panic(err)
		}
	})
	t.Logf("get: %.1f allocations, its statement by the batcher %.1f", allocs, floor)
	require.LessOrEqual(t, allocs, floor+1, "allocations per get beyond its statement's")
}
