package jobs

import (
	"fmt"
	"runtime"
	"sync"
	"weak"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
)

// scanPlans keeps pgx's scan plans for a job row's columns (jobColumns), one set per connection.
// pgx plans every column of every statement's rows afresh, by reflection: for a job row of 33
// columns that was about half of its scan's cost (~6 µs and 38 allocations), and a job's row is
// read three or four times on its way through. A plan is made with its connection's type map
// and used only with it; the set of a connection that is gone is dropped with its map.
type scanPlans struct {
	mu    sync.Mutex
	byMap map[weak.Pointer[pgtype.Map]]*columnPlans
}

// columnPlans are one connection's plans, column by column, with the type and format each was
// made for. Only the goroutine reading that connection's rows uses them.
type columnPlans struct {
	oids    []uint32
	formats []int16
	plans   []pgtype.ScanPlan
}

// forMap returns the plans made with m (empty the first time).
func (p *scanPlans) forMap(m *pgtype.Map) *columnPlans {
	k := weak.Make(m)
	p.mu.Lock()
	defer p.mu.Unlock()
	if cp, ok := p.byMap[k]; ok {
		return cp
	}
	if p.byMap == nil {
		p.byMap = map[weak.Pointer[pgtype.Map]]*columnPlans{}
	}
	cp := &columnPlans{}
	p.byMap[k] = cp
	runtime.AddCleanup(m, func(k weak.Pointer[pgtype.Map]) {
		p.mu.Lock()
		defer p.mu.Unlock()
		delete(p.byMap, k)
	}, k)
	return cp
}

// rowScanner scans a whole row into dest (pgx.RowScanner) with the plans p keeps for the
// row's connection, column by column, planning a column again only when its type or format
// differs from the one its plan was made for.
type rowScanner struct {
	p    *scanPlans
	dest []any
}

// ScanRow implements pgx.RowScanner.
func (r rowScanner) ScanRow(rows pgx.Rows) error {
	fds, vals := rows.FieldDescriptions(), rows.RawValues()
	if len(fds) != len(r.dest) || len(vals) != len(r.dest) {
		return fmt.Errorf("scan job row: %d columns, want %d", len(fds), len(r.dest))
	}
	conn := rows.Conn()
	if conn == nil { // rows read without a connection: no plans to keep
		return pgx.ScanRow(pgtype.NewMap(), fds, vals, r.dest...)
	}
	m := conn.TypeMap()
	cp := r.p.forMap(m)
	if n := len(fds) - len(cp.plans); n > 0 {
		// A row with more columns (a job's, and a flag of its statement's after them) keeps the
		// plans of the columns it shares with the others.
		cp.oids, cp.formats = append(cp.oids, make([]uint32, n)...), append(cp.formats, make([]int16, n)...)
		cp.plans = append(cp.plans, make([]pgtype.ScanPlan, n)...)
	}
	for i, fd := range fds {
		if cp.plans[i] == nil || cp.oids[i] != fd.DataTypeOID || cp.formats[i] != fd.Format {
			cp.plans[i], cp.oids[i], cp.formats[i] = m.PlanScan(fd.DataTypeOID, fd.Format, r.dest[i]), fd.DataTypeOID, fd.Format
		}
		if err := cp.plans[i].Scan(vals[i], r.dest[i]); err != nil {
			return pgx.ScanArgError{ColumnIndex: i, FieldName: fd.Name, Err: err}
		}
	}
	return nil
}
