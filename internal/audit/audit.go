// Package audit is the operators' audit log in Postgres (table audit_log, migration 015): every
// action of the console and of the operator commands of ctl, with who, what, on what, how many
// and when. It is append-only: no entry is ever changed, and entries go only when they are older
// than the audit log's retention (config retention.audit; the maintenance retention pass calls
// DeleteBefore).
package audit

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Entry is one audited action.
type Entry struct {
	ID int64     `json:"id"`
	At time.Time `json:"at"`
	// Operator is who acted: an operator's name, or "ctl:<OS user>" for the command line.
	Operator string `json:"operator"`
	// Action names what was done, e.g. "dead.retry", "tenant.create", "login".
	Action string `json:"action"`
	// Target is what it was done to: a job id, a tenant or credential name; "" for several.
	Target string `json:"target"`
	// Count is how many things the action changed (jobs retried, purged; 1 for a tenant).
	Count int `json:"count"`
	// Detail holds the action's parameters (job ids asked for, filters); nil without.
	Detail map[string]any `json:"detail,omitempty"`
}

// TargetOf is the Target of an action on the things named ids: the one name when there is one,
// "" for several (Detail names them).
func TargetOf(ids []string) string {
	if len(ids) == 1 {
		return ids[0]
	}
	return ""
}

// Queryer is what Log writes with: a pool, or a transaction so that the entry commits with
// the action it records.
type Queryer interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Log appends e (its ID and At are set by the database and returned) through q. Errors are
// wrapped database errors.
func Log(ctx context.Context, q Queryer, e Entry) (*Entry, error) {
	var detail []byte
	if e.Detail != nil {
		var err error
		if detail, err = json.Marshal(e.Detail); err != nil {
			return nil, fmt.Errorf("audit detail: %w", err)
		}
	}
	if err := q.QueryRow(ctx, `
INSERT INTO audit_log (operator, action, target, count, detail) VALUES ($1, $2, $3, $4, $5)
RETURNING id, at`, e.Operator, e.Action, e.Target, e.Count, detail).Scan(&e.ID, &e.At); err != nil {
		return nil, fmt.Errorf("write audit log: %w", err)
	}
	return &e, nil
}

// ErrBadCursor is the error for a ListParams.After that no Page made (garbled, or altered).
var ErrBadCursor = errors.New("malformed audit page cursor")

// ListParams select entries for List and Page.
type ListParams struct {
	// Operator keeps only this operator's entries; "": everyone's.
	Operator string
	// Limit caps the entries returned. Default 50.
	Limit int
	// After is the Next of the previous Page: the entries older than that page's last. "": from
	// the newest. A cursor whose entries the retention deleted meanwhile still goes on from there.
	After string
}

// Page is a page of entries, newest first.
type Page struct {
	Entries []Entry
	// Next is the ListParams.After of the following page; "" on the last one.
	Next string
}

// List returns entries, newest first (Page's entries). Errors: as Page's.
func List(ctx context.Context, pool *pgxpool.Pool, p ListParams) ([]Entry, error) {
	page, err := ListPage(ctx, pool, p)
	if err != nil {
		return nil, err
	}
	return page.Entries, nil
}

// ListPage returns a page of entries, newest first, from p.After. The cursor is the id of the
// page's last entry (ids grow with every entry appended), so a page is one walk of the primary
// key down from it, however long the log. Errors: ErrBadCursor, or a wrapped database error.
func ListPage(ctx context.Context, pool *pgxpool.Pool, p ListParams) (*Page, error) {
	if p.Limit <= 0 {
		p.Limit = 50
	}
	p.Limit = min(p.Limit, math.MaxInt-1) // room for the one past it below
	before := int64(math.MaxInt64)
	if p.After != "" {
		id, err := strconv.ParseInt(p.After, 10, 64)
		if err != nil || id < 1 {
			return nil, ErrBadCursor
		}
		before = id
	}
	// One entry past the limit tells whether a following page has any.
	rows, err := pool.Query(ctx, `
SELECT id, at, operator, action, target, count, detail FROM audit_log
WHERE ($1 = '' OR operator = $1) AND id < $3 ORDER BY id DESC LIMIT $2`, p.Operator, p.Limit+1, before)
	if err != nil {
		return nil, fmt.Errorf("list audit log: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Entry, error) {
		var e Entry
		err := r.Scan(&e.ID, &e.At, &e.Operator, &e.Action, &e.Target, &e.Count, &e.Detail)
		return e, err
	})
	if err != nil {
		return nil, fmt.Errorf("list audit log: %w", err)
	}
	page := &Page{Entries: out}
	if len(out) > p.Limit {
		page.Entries = out[:p.Limit]
		page.Next = strconv.FormatInt(page.Entries[p.Limit-1].ID, 10)
	}
	return page, nil
}

// Oldest returns when the first entry still stored (by id: entries are appended in time order)
// was written, and false when the log is empty: what DeleteBefore has yet to delete begins there.
// One probe of the primary key.
func Oldest(ctx context.Context, pool *pgxpool.Pool) (time.Time, bool, error) {
	var at time.Time
	err := pool.QueryRow(ctx, `SELECT at FROM audit_log ORDER BY id LIMIT 1`).Scan(&at)
	if errors.Is(err, pgx.ErrNoRows) {
		return time.Time{}, false, nil
	}
	if err != nil {
		return time.Time{}, false, fmt.Errorf("read oldest audit entry: %w", err)
	}
	return at, true, nil
}

// DeleteBefore deletes up to limit of the oldest entries written before `before` and returns how
// many; callers delete a large backlog in several calls, so that no statement runs long.
//
// Entries are appended in time order, so the expired ones are the first by id: the statement
// reads the first limit entries by the primary key and deletes those before the first of them
// written at or after `before`, without an index on at (one would cost every insert) and
// without reading the entries it keeps. An entry written out of order (its transaction began
// before an earlier id's) goes with the next call that finds it below that boundary. Nothing
// else changes or locks entries, so nothing waits on it.
func DeleteBefore(ctx context.Context, pool *pgxpool.Pool, before time.Time, limit int) (int64, error) {
	tag, err := pool.Exec(ctx, deleteBeforeSQL, before, limit)
	if err != nil {
		return 0, fmt.Errorf("delete expired audit entries: %w", err)
	}
	return tag.RowsAffected(), nil
}

// deleteBeforeSQL is DeleteBefore's statement ($1 before, $2 limit). The boundary (the first
// entry written at or after $1) is looked for among the limit entries read, not in the whole
// log: looked for in the log, it read every expired entry to find it, each call, so a backlog
// of N expired entries (retention.audit lowered, or turned back on) cost about N²/limit reads
// to delete (300,000: 118 ms and 3,000 buffers a call of 500). The same entries go. The ids
// to delete are an array, which the delete finds by the primary key whatever the table's
// statistics say (as `IN (subquery)`, a table not analyzed yet was read whole to join them).
const deleteBeforeSQL = `
WITH head AS MATERIALIZED (SELECT id, at FROM audit_log ORDER BY id LIMIT $2)
DELETE FROM audit_log WHERE id = ANY (ARRAY(
	SELECT id FROM head
	WHERE id < coalesce((SELECT min(id) FROM head WHERE at >= $1), 9223372036854775807)))`
