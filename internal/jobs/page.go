package jobs

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// ErrBadCursor is the error for a page cursor that Page did not make (or that was altered).
var ErrBadCursor = errors.New("malformed page cursor")

// PageParams select a page of jobs for Page (the console's job list). Zero fields do not filter.
type PageParams struct {
	Status Status
	Tenant string
	// Credential keeps the jobs sent to this credential: their own, or a fallback they failed
	// over to (the one that answered, the one they run or died on), as DeadFilter.Credential. A
	// fallback a job has not reached does not select it.
	Credential string
	// After is the Next of the previous page; "": the first page.
	After string
	// Limit caps the rows of the page. Default 50, at most 500.
	Limit int
}

// JobPage is one page of jobs, newest first.
type JobPage struct {
	Jobs []*Job
	// Next is the cursor of the following page; "" on the last one. A page with a status or
	// credential filter may have fewer than Limit jobs, or none, and a Next: its read stopped at
	// PageScanRows jobs (see Page).
	Next string
}

// PageScanRows is the most jobs one page with a status or credential filter reads (newest
// first, from its cursor): a filter that matches few jobs or none would otherwise read the
// whole table for one page (1.6 s on 400,000 jobs).
const PageScanRows = 10_000

// Page returns every tenant's jobs that p selects, newest first (created_at, then id), one page
// at a time, without their requests and answers (Job.Request and Job.Result are nil: a list
// shows neither, and they made a page's cost grow with their size). The cursor is the (created_at, id) of the page's last row, so a page is read
// through jobs_created_idx (or jobs_tenant_created_idx with a tenant) from where the previous one
// stopped, whatever the page number: on 10 million rows a page costs what the first one costs
// (see TestStore_PageUsesIndex). Jobs created after the first page was read appear on no page;
// a deleted job simply leaves its page. A page with a status or credential filter reads at most
// PageScanRows jobs (of the tenant's, with a tenant) from its cursor: when they hold fewer than
// Limit matches, it ends there, with what they held (perhaps nothing) and a Next that goes on
// from the last job read. Errors: ErrBadCursor, or a wrapped database error.
func (s *Store) Page(ctx context.Context, p PageParams) (*JobPage, error) {
	if p.Limit <= 0 {
		p.Limit = 50
	}
	p.Limit = min(p.Limit, 500)
	var bound *pageBound
	boundSQL, boundArgs, err := pageBoundQuery(p)
	if err != nil {
		return nil, err
	}
	var list []*Job
	err = s.inOrderOfIndex(ctx, func(tx pgx.Tx) error {
		if boundSQL != "" {
			var b pageBound
			switch err := tx.QueryRow(ctx, boundSQL, boundArgs...).Scan(&b.at, &b.id); {
			case err == nil:
				bound = &b
			case !errors.Is(err, pgx.ErrNoRows): // none: fewer jobs than PageScanRows are left
				return err
			}
		}
		sql, args, err := pageQuery(p, bound)
		if err != nil {
			return err
		}
		rows, err := tx.Query(ctx, sql, args...)
		if err != nil {
			return err
		}
		list, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (*Job, error) { return s.scanJob(r) })
		return err
	})
	if errors.Is(err, ErrBadCursor) {
		return nil, err
	}
	if err != nil {
		return nil, fmt.Errorf("page jobs: %w", err)
	}
	page := &JobPage{Jobs: list}
	switch {
	case len(list) > p.Limit:
		page.Jobs = list[:p.Limit]
		last := page.Jobs[p.Limit-1]
		page.Next = encodeCursor(last.CreatedAt, last.ID)
	case bound != nil:
		page.Next = encodeCursor(bound.at, bound.id)
	}
	return page, nil
}

// pageBound is the last job a filtered page may read (see Page): the PageScanRows-th from its
// cursor.
type pageBound struct {
	at time.Time
	id string
}

// pageBoundQuery is the statement that finds p's pageBound, or "" when p has no status or
// credential filter (its page reads its index from the cursor to its limit). It reads
// PageScanRows entries of the page's index (jobs_created_idx alone, or jobs_tenant_created_idx
// and the rows they name), no row more.
func pageBoundQuery(p PageParams) (string, []any, error) {
	if p.Status == "" && p.Credential == "" {
		return "", nil, nil
	}
	return pageSQL(PageParams{Tenant: p.Tenant, After: p.After}, nil, "created_at, id::text", PageScanRows-1, 1)
}

// pageQuery is Page's statement: it reads Limit+1 rows (jobColumnsNoPayload), the last only to
// know whether a next page exists, and none past bound (nil: none).
func pageQuery(p PageParams, bound *pageBound) (string, []any, error) {
	return pageSQL(p, bound, jobColumnsNoPayload, 0, p.Limit+1)
}

// pageSQL selects columns of p's jobs, newest first, none past bound (nil: none), skipping
// offset and returning at most limit.
func pageSQL(p PageParams, bound *pageBound, columns string, offset, limit int) (string, []any, error) {
	var args []any
	arg := func(v any) string {
		args = append(args, v)
		return "$" + strconv.Itoa(len(args))
	}
	conds := []string{"true"}
	if p.Status != "" {
		conds = append(conds, "status = "+arg(string(p.Status)))
	}
	if p.Tenant != "" {
		conds = append(conds, "tenant = "+arg(p.Tenant))
	}
	if p.Credential != "" {
		conds = append(conds, sentTo("", arg(p.Credential)))
	}
	if p.After != "" {
		at, id, err := decodeCursor(p.After)
		if err != nil {
			return "", nil, err
		}
		conds = append(conds, "(created_at, id) < ("+arg(at)+"::timestamptz, "+arg(id)+"::uuid)")
	}
	if bound != nil {
		conds = append(conds, "(created_at, id) >= ("+arg(bound.at)+"::timestamptz, "+arg(bound.id)+"::uuid)")
	}
	// jobs.id, not id: ORDER BY id names the output column id::text (the columns' first, and the
	// bound's), which sorted the ids as text, by the database's collation, not as the index and
	// the cursor's condition order them (uuids, bytewise): a sort on every page, and under a
	// collation that compares digits by value (ICU's kn) pages that skipped jobs created in the
	// same microsecond as the last one shown (TestStore_PageOrdersIDsAsUUIDs).
	sql := `SELECT ` + columns + ` FROM jobs WHERE ` + strings.Join(conds, " AND ") +
		` ORDER BY jobs.created_at DESC, jobs.id DESC`
	if offset > 0 {
		sql += ` OFFSET ` + arg(offset)
	}
	return sql + ` LIMIT ` + arg(limit), args, nil
}

// encodeCursor makes the opaque cursor of a row: its creation time (µs since the epoch, the
// precision of Postgres) and its id.
func encodeCursor(at time.Time, id string) string {
	return base64.RawURLEncoding.EncodeToString([]byte(strconv.FormatInt(at.UnixMicro(), 10) + "," + id))
}

// maxCursorMicros is the latest time a cursor may hold, in µs since the epoch: the start of year
// 10000, past any job's creation.
const maxCursorMicros = 253402300800 * 1_000_000

func decodeCursor(c string) (time.Time, string, error) {
	b, err := base64.RawURLEncoding.DecodeString(c)
	if err != nil {
		return time.Time{}, "", ErrBadCursor
	}
	us, id, ok := strings.Cut(string(b), ",")
	n, err := strconv.ParseInt(us, 10, 64)
	// A cursor holds a job's creation time: another time is no cursor Page made, and one that
	// Postgres cannot hold would fail the query.
	if !ok || err != nil || n < 0 || n > maxCursorMicros || !ValidID(id) {
		return time.Time{}, "", ErrBadCursor
	}
	return time.UnixMicro(n), id, nil
}

// PurgeDeadIDs deletes the jobs among ids that are dead, with their attempts, events and
// idempotency keys, in one transaction, and returns the ids deleted. A job that is not dead
// (any more: retried meanwhile), unknown, malformed or locked by a concurrent change is left
// alone and not returned.
func (s *Store) PurgeDeadIDs(ctx context.Context, ids []string) ([]string, error) {
	valid := make([]string, 0, len(ids))
	for _, id := range ids {
		if ValidID(id) {
			valid = append(valid, id)
		}
	}
	rows, err := s.pool.Query(ctx, purgeDeadIDsSQL, valid)
	if err != nil {
		return nil, fmt.Errorf("purge dead jobs: %w", err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("purge dead jobs: %w", err)
	}
	return out, nil
}

// purgeDeadIDsSQL is PurgeDeadIDs's statement. Attempts and events are found by primary key (=
// ANY of an array, as DeleteFinished's): joined with the deleted jobs, a planner without
// statistics read both tables whole for a selection of the console's size.
const purgeDeadIDsSQL = `
WITH victims AS (
	SELECT id FROM jobs WHERE status = 'dead' AND id = ANY($1::uuid[]) FOR UPDATE SKIP LOCKED` + deleteVictimsSQL + `
SELECT id::text FROM d, notified`

// DeadByReason counts every dead job by its dead reason (an index-only scan of
// jobs_dead_reason_idx, migration 018: dead jobs only).
func (s *Store) DeadByReason(ctx context.Context) (map[string]int, error) {
	rows, err := s.pool.Query(ctx, deadByReasonSQL)
	if err != nil {
		return nil, fmt.Errorf("count dead jobs: %w", err)
	}
	out := map[string]int{}
	var reason string
	var n int
	if _, err := pgx.ForEachRow(rows, []any{&reason, &n}, func() error {
		out[reason] = n
		return nil
	}); err != nil {
		return nil, fmt.Errorf("count dead jobs: %w", err)
	}
	return out, nil
}

// deadByReasonSQL is DeadByReason's statement.
const deadByReasonSQL = `
SELECT coalesce(dead_reason, ''), count(*) FROM jobs WHERE status = 'dead' AND finished_at IS NOT NULL GROUP BY 1`
