package batchlane

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// The files a batch keeps at the provider (OpenAI's input, output and error files; Anthropic's
// batches have none) are recorded in provider_batch_files (migration 024) as soon as their ids
// are known, and deleted by the leader's pass (deleteDueFiles), not by the call that closes the
// batch: a delete that fails, or a leader that dies before it, leaves the row, and a later pass
// tries again.
const (
	// fileDeletesPerPass bounds the deletes one pass makes (a backlog goes over several).
	fileDeletesPerPass = 100
	// oldGiveUpsPerPass bounds the files given up by a leader of an older release that one pass
	// moves out of its range (see dueFiles): an update of a row each, no call to the provider.
	oldGiveUpsPerPass = 1000
	// maxFileDeleteAttempts bounds the deletes of one file: past it, the file is left at the
	// provider (logged, counted gave_up), its row kept for the operator.
	maxFileDeleteAttempts = 10
	// fileRetryBase and fileRetryCap are the backoff between a file's deletes: fileRetryBase
	// doubled per failed attempt, at most fileRetryCap (ten attempts take about five hours).
	fileRetryBase = time.Minute
	fileRetryCap  = time.Hour
	// deleteFilesTimeout bounds one pass's deletes, so that a provider slow to answer them holds
	// the pass no longer.
	deleteFilesTimeout = 30 * time.Second
	// maxFileErrorLen bounds the error kept with a file whose delete failed.
	maxFileErrorLen = 500
	// uploadSweepInterval is how often a leader lists a credential's uploads at the provider
	// (see adoptUploads): at its first pass, then at most once an interval.
	uploadSweepInterval = time.Hour
	// uploadSweepTimeout bounds a pass's listings, of every credential due, together: a
	// provider whose list hangs holds the pass's sends and polls back a minute, not a minute for
	// each credential.
	uploadSweepTimeout = time.Minute
)

// batchFile is a file a batch keeps at the provider, due for its delete.
type batchFile struct {
	Credential, ID, Batch string
	Attempts              int
}

// recordUpload records file id, uploaded at credential's provider for batch: before the batch
// is created, so that an upload whose create fails, or whose process dies before recording the
// batch, is deleted all the same. A file recorded before is left as it is.
func (s store) recordUpload(ctx context.Context, batch, credential, id string) error {
	if _, err := s.pool.Exec(ctx, `INSERT INTO provider_batch_files (credential, file_id, batch, kind)
VALUES ($1, $2, $3, 'upload') ON CONFLICT (credential, file_id) DO NOTHING`, credential, id, batch); err != nil {
		return fmt.Errorf("record batch file %s: %w", id, err)
	}
	return nil
}

// adoptUploads records ups, credential's uploads listed at the provider (Client.Uploads), as
// recordUpload would have recorded them: those of a batch of credential whose row is there and
// that no row records yet (their process died between the upload's answer and its record, or it
// is recording them now: either way, the row is the one that process writes, and ON CONFLICT
// on both sides keeps one). It returns how many it recorded.
func (s store) adoptUploads(ctx context.Context, credential string, ups []Upload) (int64, error) {
	if len(ups) == 0 {
		return 0, nil
	}
	ids, refs := make([]string, len(ups)), make([]string, len(ups))
	for i, u := range ups {
		ids[i], refs[i] = u.ID, u.Ref
	}
	tag, err := s.pool.Exec(ctx, `INSERT INTO provider_batch_files (credential, file_id, batch, kind)
SELECT $1, u.id, u.batch, 'upload' FROM unnest($2::text[], $3::uuid[]) AS u(id, batch)
WHERE EXISTS (SELECT 1 FROM provider_batches b WHERE b.id = u.batch AND b.credential = $1)
ON CONFLICT (credential, file_id) DO NOTHING`, credential, ids, refs)
	if err != nil {
		return 0, fmt.Errorf("record the uploads no row records: %w", err)
	}
	return tag.RowsAffected(), nil
}

// releaseUploads marks the uploads recorded for batch as read by no batch, to delete without
// waiting for its close: called before a send again that follows a look-up finding no batch at
// the provider (under the send's claim, so no earlier send is still on its way), none of the
// earlier sends' uploads became one.
func (s store) releaseUploads(ctx context.Context, batch string) error {
	if _, err := s.pool.Exec(ctx, `UPDATE provider_batch_files SET released = true
WHERE batch = $1 AND kind = 'upload' AND NOT released`, batch); err != nil {
		return fmt.Errorf("release the uploads of batch %s: %w", batch, err)
	}
	return nil
}

// endedWithFiles is ended, recording in the same transaction files, the files the ended batch
// keeps at credential's provider: the close and what to delete after it are committed together.
func (s store) endedWithFiles(ctx context.Context, id, credential, state, providerState string, files []string) error {
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if len(files) > 0 {
			if _, err := tx.Exec(ctx, `INSERT INTO provider_batch_files (credential, file_id, batch, kind)
SELECT $1, f, $2, 'ended' FROM unnest($3::text[]) AS f ON CONFLICT (credential, file_id) DO NOTHING`,
				credential, id, files); err != nil {
				return fmt.Errorf("record batch files: %w", err)
			}
		}
		return endBatch(ctx, tx, id, state, providerState)
	})
	if err != nil {
		return fmt.Errorf("end batch: %w", err)
	}
	return nil
}

// dueFiles returns up to limit files of credentials due for their delete at now: those of a
// closed batch (ended or canceled, or whose row retention deleted) or released, whose attempts
// are not used up, the longest due first. FOR UPDATE SKIP LOCKED is not needed: one leader
// deletes. It scans next_try_at's index up to now, so a given-up file (next_try_at infinity, see
// fileFailed) is not read. In the same statement it moves out of that range, up to
// oldGiveUpsPerPass of them, the files a leader of an older release gave up (attempts used up,
// next_try_at left at their last backoff), of any credential, without a delete: read once more
// by this statement (its UPDATE is not visible to its SELECT) and filtered on attempts, never
// again. The UPDATE checks the row it locks again, so that a file an operator retried meanwhile
// (RetryFiles: no attempts, due at once) is left as RetryFiles made it.
//
// The statement is planned anew each time (the unnamed statement, no generic plan): the files
// of a credential no longer configured are never tried, so they stay due at once (-infinity,
// the start of next_try_at's index), and a generic plan that scans that index read every one of
// them in each pass; planned for its credentials, the scan goes through the primary key when
// their rows are fewer than those in range (see docs/decisions.md).
func (s store) dueFiles(ctx context.Context, credentials []string, now time.Time, limit int) ([]batchFile, error) {
	rows, err := s.pool.Query(ctx, `WITH given_up AS (
	UPDATE provider_batch_files SET next_try_at = 'infinity'
	WHERE (credential, file_id) IN (SELECT credential, file_id FROM provider_batch_files
		WHERE next_try_at > '-infinity' AND next_try_at <= $2 AND attempts >= $3 LIMIT $5)
		AND next_try_at > '-infinity' AND attempts >= $3
)
SELECT f.credential, f.file_id, f.batch::text, f.attempts FROM provider_batch_files f
LEFT JOIN provider_batches b ON b.id = f.batch
WHERE f.credential = ANY($1::text[]) AND f.next_try_at <= $2 AND f.attempts < $3
	AND (f.released OR b.id IS NULL OR b.state IN ('ended', 'canceled'))
ORDER BY f.next_try_at LIMIT $4`, pgx.QueryExecModeCacheDescribe, credentials, now, maxFileDeleteAttempts, limit,
		oldGiveUpsPerPass)
	if err != nil {
		return nil, fmt.Errorf("list batch files to delete: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (f batchFile, err error) {
		err = r.Scan(&f.Credential, &f.ID, &f.Batch, &f.Attempts)
		return f, err
	})
	if err != nil {
		return nil, fmt.Errorf("list batch files to delete: %w", err)
	}
	return out, nil
}

// fileDeleted removes the row of file f, deleted at the provider (or gone already), and reports
// whether it removed it: false when another pass that overlapped this one (see deleteDueFiles)
// removed it first.
func (s store) fileDeleted(ctx context.Context, f batchFile) (bool, error) {
	tag, err := s.pool.Exec(ctx, `DELETE FROM provider_batch_files WHERE credential = $1 AND file_id = $2`,
		f.Credential, f.ID)
	if err != nil {
		return false, fmt.Errorf("forget deleted batch file %s: %w", f.ID, err)
	}
	return tag.RowsAffected() > 0, nil
}

// fileFailed records a delete of file f that failed with msg: one attempt more, the next at next.
// A file whose attempts it uses up (given up) gets next_try_at infinity instead: out of the range
// dueFiles scans on next_try_at's index, which would otherwise read every given-up row in each
// pass (their next_try_at long past) only to filter them out on attempts. It reports whether the
// row was there: false when an operator forgot the file (ForgetFiles) or another pass deleted it
// while this delete was under way.
func (s store) fileFailed(ctx context.Context, f batchFile, next time.Time, msg string) (bool, error) {
	// Text Postgres takes: valid UTF-8 (the cut may split a rune), no NUL.
	msg = strings.ReplaceAll(strings.ToValidUTF8(msg[:min(len(msg), maxFileErrorLen)], ""), "\x00", "")
	tag, err := s.pool.Exec(ctx, `UPDATE provider_batch_files SET attempts = attempts + 1, last_error = $4,
	next_try_at = CASE WHEN attempts + 1 >= $5 THEN 'infinity' ELSE $3::timestamptz END
WHERE credential = $1 AND file_id = $2`, f.Credential, f.ID, next, msg, maxFileDeleteAttempts)
	if err != nil {
		return false, fmt.Errorf("record a failed delete of batch file %s: %w", f.ID, err)
	}
	return tag.RowsAffected() > 0, nil
}

// fileRetryDelay is the wait before the delete after attempts failed ones (see fileRetryBase).
func fileRetryDelay(attempts int) time.Duration {
	return doubled(fileRetryBase, attempts-1, fileRetryCap)
}

// deleteDueFiles deletes the batch files due (see dueFiles) of the configured credentials at
// their providers, one call each, within deleteFilesTimeout: a file deleted, or one the provider
// no longer has (404), loses its row; a delete that failed is tried again after fileRetryDelay,
// up to maxFileDeleteAttempts, after which the file is left at the provider, logged once, its
// row kept for the operator. A failed delete fails nothing (it is counted:
// llmq_batch_file_deletes_total); an error of Postgres is returned. A pass cut short (the lead
// lost, the worker stopping) records nothing of the delete it cut.
func (b *Batcher) deleteDueFiles(ctx context.Context) error {
	if b.crashAfterClose != nil {
		return b.crashAfterClose
	}
	creds := make([]string, 0, len(b.lanes))
	for name := range b.lanes {
		creds = append(creds, name)
	}
	files, err := b.store.dueFiles(ctx, creds, b.cfg.Now(), fileDeletesPerPass)
	if err != nil || len(files) == 0 {
		return err
	}
	dctx, cancel := context.WithTimeout(ctx, deleteFilesTimeout)
	defer cancel()
	var errs []error
	for _, f := range files {
		err := b.lanes[f.Credential].Client.DeleteFiles(dctx, []string{f.ID})
		if ctx.Err() != nil {
			break
		}
		if err == nil {
			// Counted by the pass whose statement removed its row: a row left (Postgres failed)
			// is deleted again by the next pass, a 404 then, and counted by the pass that removes
			// it; two passes that overlap (the lead lost and taken while one runs) both delete
			// the file, and the one that finds its row gone counts nothing.
			removed, err := b.store.fileDeleted(ctx, f)
			if err != nil {
				errs = append(errs, err)
			} else if removed {
				b.cfg.Metrics.fileDelete(f.Credential, "deleted")
			}
			continue
		}
		// Counted and logged unless its row was gone: a file forgotten (ctl batch files forget) or
		// deleted by an overlapping pass meanwhile is nobody's to delete any more.
		kept, rerr := b.store.fileFailed(ctx, f, b.cfg.Now().Add(fileRetryDelay(f.Attempts+1)), err.Error())
		if rerr != nil {
			errs = append(errs, rerr)
		}
		if kept || rerr != nil {
			outcome := "failed"
			if f.Attempts+1 >= maxFileDeleteAttempts {
				outcome = "gave_up"
				b.cfg.Logger.WarnContext(ctx, "a batch file could not be deleted at the provider: left there, its row kept",
					"credential", f.Credential, "file_id", f.ID, "batch", f.Batch, "attempts", f.Attempts+1, "error", err)
			}
			b.cfg.Metrics.fileDelete(f.Credential, outcome)
		}
		if dctx.Err() != nil {
			break // the pass's time for deletes is up: the rest wait for the next
		}
	}
	return errors.Join(errs...)
}

// adoptUploads lists, at most once an uploadSweepInterval per credential (at a lead's first
// pass, then an interval on; within uploadSweepTimeout for the pass, the credentials it did not
// reach left to the next pass), the uploads that each configured credential's provider holds
// (Client.Uploads) and records those of its batches that no row records (store.adoptUploads):
// uploaded by a process that died between the upload's answer and its record. Recorded as that
// process would have recorded them, they are deleted when the record would have had them
// deleted: when their batch closes, or a send again releases them (see store.releaseUploads), so
// that a file a live process is recording now, or a batch reads, is never deleted before. A
// listing that fails is logged at warn and tried again an interval on (an OpenAI-compatible
// endpoint may list no files): it fails nothing else. An error of Postgres is returned, and the
// credential listed again at the next pass.
func (b *Batcher) adoptUploads(ctx context.Context) error {
	b.sweepMu.Lock()
	defer b.sweepMu.Unlock()
	var errs []error
	lctx, cancel := context.WithTimeout(ctx, cmp.Or(b.sweepTimeout, uploadSweepTimeout))
	defer cancel()
	for _, lane := range b.cfg.Lanes {
		now := b.cfg.Now()
		if at, ok := b.sweptAt[lane.Credential]; ok && now.Sub(at) < uploadSweepInterval {
			continue
		}
		if lctx.Err() != nil { // the pass's time for listings spent: this one at the next pass
			break
		}
		b.sweptAt[lane.Credential] = now
		ups, err := lane.Client.Uploads(lctx)
		if ctx.Err() != nil {
			delete(b.sweptAt, lane.Credential)
			return errors.Join(errs...)
		}
		if err != nil {
			b.cfg.Logger.WarnContext(ctx, "could not list the batch input files at the provider; listed again in an hour",
				"credential", lane.Credential, "error", err)
		}
		n, err := b.store.adoptUploads(ctx, lane.Credential, ups)
		if err != nil {
			delete(b.sweptAt, lane.Credential)
			errs = append(errs, err)
			continue
		}
		if n > 0 {
			b.cfg.Logger.InfoContext(ctx, "recorded batch input files whose upload no row recorded, to delete",
				"credential", lane.Credential, "files", n)
		}
	}
	return errors.Join(errs...)
}

// forgetSweeps clears when each credential's uploads were last listed, so that a lead's first
// pass lists them all, as a process that regained the lead within the hour did not.
func (b *Batcher) forgetSweeps() {
	b.sweepMu.Lock()
	defer b.sweepMu.Unlock()
	clear(b.sweptAt)
}
