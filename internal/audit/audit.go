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
	"slices"
	"strconv"
	"strings"
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

// ErrUnknownAction is the error for a ListParams.Actions name that is not one of Actions: no
// entry has it, so a filter on it (a typo) would list nothing, page after page.
var ErrUnknownAction = errors.New("unknown audit action")

// Actions returns the names of the actions written to the log, sorted: what an action filter
// may name. TestActions_NameEveryActionWritten fails when the code writes one not listed here.
func Actions() []string {
	return []string{"batch_file.forget", "batch_file.retry", "credential.resume", "dead.purge", "dead.retry",
		"job.cancel", "login", "logout", "operator.create", "operator.revoke", "tenant.cancel_jobs",
		"tenant.create", "tenant.delete", "tenant.revoke", "tenant.rotate", "tenant.weight"}
}

// CheckActions returns ErrUnknownAction, naming the first name of names that is not one of
// Actions and listing those, or nil.
func CheckActions(names []string) error {
	known := Actions()
	for _, n := range names {
		if !slices.Contains(known, n) {
			return fmt.Errorf("%w %q: the actions are %s", ErrUnknownAction, n, strings.Join(known, ", "))
		}
	}
	return nil
}

// PageScanRows is the most entries one page with an action filter reads past its cursor (newest
// first): no index leads with action, so a filter that matches few entries or none would
// otherwise read the whole log for one page.
const PageScanRows = 10_000

// ListParams select entries for List and Page.
type ListParams struct {
	// Operator keeps only this operator's entries; "": everyone's.
	Operator string
	// Actions keeps only the entries of these actions (each one of Actions); none: every
	// action's. A page with it reads at most PageScanRows entries (see ListPage).
	Actions []string
	// Limit caps the entries returned. Default 50.
	Limit int
	// After is the Next of the previous Page: the entries older than that page's last. "": from
	// the newest. A cursor whose entries the retention deleted meanwhile still goes on from there.
	After string
}

// Page is a page of entries, newest first.
type Page struct {
	Entries []Entry
	// Next is the ListParams.After of the following page; "" on the last one. A page with an
	// action filter may have fewer than Limit entries, or none, and a Next: its read stopped at
	// PageScanRows entries (see ListPage).
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
// key down from it, however long the log. A page with an action filter reads at most PageScanRows
// entries from its cursor: when they hold fewer than Limit matches, it ends there, with what they
// held (perhaps nothing) and a Next that goes on from the last entry read. Errors: ErrBadCursor,
// ErrUnknownAction, or a wrapped database error.
func ListPage(ctx context.Context, pool *pgxpool.Pool, p ListParams) (*Page, error) {
	if err := CheckActions(p.Actions); err != nil {
		return nil, err
	}
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
	if len(p.Actions) > 0 {
		return listScanned(ctx, pool, p, before)
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
	return pageOf(out, p.Limit), nil
}

// pageOf is the page of out, the entries read with one past limit when a following page has any.
func pageOf(out []Entry, limit int) *Page {
	page := &Page{Entries: out}
	if len(out) > limit {
		page.Entries = out[:limit]
		page.Next = strconv.FormatInt(page.Entries[limit-1].ID, 10)
	}
	return page
}

// listScannedSQL is the statement of a page with an action filter ($1 operator or "", $2 the
// limit and one, $3 the cursor, $4 PageScanRows, $5 the actions): the PageScanRows entries below
// the cursor, walked down the primary key, then the first matches among them, read whole. Its
// first column is the id of the last entry read when the walk read PageScanRows (the bound
// stopped it; NULL when it reached the log's first), on every row, and on a row of its own
// (the others NULL) when nothing matched.
const listScannedSQL = `
WITH scanned AS MATERIALIZED (
	SELECT id, operator, action FROM audit_log WHERE id < $3 ORDER BY id DESC LIMIT $4),
edge AS (SELECT CASE WHEN count(*) = $4 THEN min(id) END AS low FROM scanned),
hits AS (
	SELECT id FROM scanned WHERE ($1 = '' OR operator = $1) AND action = ANY ($5)
	ORDER BY id DESC LIMIT $2)
SELECT edge.low, l.id, l.at, l.operator, l.action, l.target, l.count, l.detail
FROM edge LEFT JOIN (audit_log l JOIN hits ON hits.id = l.id) ON true
ORDER BY l.id DESC`

// listScanned is ListPage with an action filter: at most PageScanRows entries read from before.
func listScanned(ctx context.Context, pool *pgxpool.Pool, p ListParams, before int64) (*Page, error) {
	rows, err := pool.Query(ctx, listScannedSQL, p.Operator, p.Limit+1, before, PageScanRows, p.Actions)
	if err != nil {
		return nil, fmt.Errorf("list audit log: %w", err)
	}
	var low *int64
	var out []Entry
	for rows.Next() {
		var id *int64
		var e struct {
			at                       *time.Time
			operator, action, target *string
			count                    *int
		}
		var detail map[string]any
		if err := rows.Scan(&low, &id, &e.at, &e.operator, &e.action, &e.target, &e.count, &detail); err != nil {
			rows.Close()
			return nil, fmt.Errorf("list audit log: %w", err)
		}
		if id != nil {
			out = append(out, Entry{ID: *id, At: *e.at, Operator: *e.operator, Action: *e.action, Target: *e.target,
				Count: *e.count, Detail: detail})
		}
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list audit log: %w", err)
	}
	page := pageOf(out, p.Limit)
	if page.Next == "" && low != nil {
		page.Next = strconv.FormatInt(*low, 10)
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
