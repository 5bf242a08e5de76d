// Package idem makes duplicate submissions safe: idempotency keys claimed in Postgres, and request
// fingerprints that ignore key order and white space.
//
// A key is claimed inside the transaction that creates its job, so the key and the job commit or
// vanish together. Concurrent claims of one key serialise on the key's row: exactly one claimer
// inserts it, every other one gets that claimer's job ID once it commits.
package idem

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"regexp"

	"github.com/jackc/pgx/v5"
)

// MaxKeyLength is the longest Idempotency-Key accepted.
const MaxKeyLength = 255

var keyRE = regexp.MustCompile(`^[\x21-\x7e]+$`)

// ErrInvalidKey is returned by ValidateKey for an empty, too long or non-printable key.
var ErrInvalidKey = errors.New("invalid idempotency key")

// ValidateKey checks that key is 1..MaxKeyLength printable ASCII characters without spaces.
func ValidateKey(key string) error {
	if len(key) == 0 || len(key) > MaxKeyLength || !keyRE.MatchString(key) {
		return fmt.Errorf("%w: must be 1-%d printable ASCII characters without spaces", ErrInvalidKey, MaxKeyLength)
	}
	return nil
}

// Fingerprint returns the SHA-256 (hex) of the canonical form of a JSON document: object keys
// sorted, insignificant white space removed, numbers kept as written. Two bodies that differ
// only in key order or spacing have the same fingerprint. It fails on invalid JSON.
func Fingerprint(doc []byte) (string, error) {
	canon, err := Canonical(doc)
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(canon)
	var digits [2 * sha256.Size]byte // on the stack: the string is the one allocation
	hex.Encode(digits[:], sum[:])
	return string(digits[:]), nil
}

// Canonical re-encodes a JSON document with sorted object keys and no insignificant white space.
// Numbers keep their literal form; strings are re-escaped consistently. Its bytes are those of
// encoding/json's decoder into any (UseNumber) and encoder (no HTML escaping), which fingerprints
// stored by earlier releases were made of: a document is written by one walk over it
// (appendCanonical), and only one that walk does not take (invalid JSON, deep nesting, large
// members nested in many objects) is decoded and encoded (canonicalJSON), whose error is the
// answer.
func Canonical(doc []byte) ([]byte, error) {
	if out, ok := appendCanonical(nil, doc); ok {
		return out, nil
	}
	return canonicalJSON(doc)
}

// canonicalJSON is Canonical by encoding/json: the definition of the canonical form, and the
// answer for documents appendCanonical does not write.
func canonicalJSON(doc []byte) ([]byte, error) {
	dec := json.NewDecoder(bytes.NewReader(doc))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, fmt.Errorf("canonical json: %w", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, errors.New("canonical json: trailing data after the document")
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	// encoding/json writes map keys in sorted order, which is what makes this canonical.
	if err := enc.Encode(v); err != nil {
		return nil, fmt.Errorf("canonical json: %w", err)
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n")), nil
}

// Querier is the part of pgx.Tx (or a pool) that Claim needs.
type Querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Claim is the outcome of claiming a key.
type Claim struct {
	// Claimed is true when this call inserted the key: the caller's job is the key's job.
	Claimed bool
	// JobID is the job the key belongs to (the caller's when Claimed).
	JobID string
	// Fingerprint is the fingerprint stored with the key.
	Fingerprint string
}

// Matches reports whether the stored body is the same as the one with fingerprint fp.
func (c Claim) Matches(fp string) bool { return c.Fingerprint == fp }

// ClaimKey claims (tenant, key) for jobID in one statement. Run it in the transaction that inserts
// the job. When another transaction holds an uncommitted claim on the same key, ClaimKey waits
// for it: after its commit, it returns that job (Claimed false); after its rollback, it claims.
// A key committed before the statement began is answered from a plain read: no row lock, no
// write, so concurrent replays of one key do not wait for one another's commits. Such an answer
// names a job the caller must read in the same transaction: a job deleted meanwhile (retention,
// a purge: the key goes with it) is not found, and a new claim would insert the key again.
func ClaimKey(ctx context.Context, q Querier, tenant, key, fingerprint, jobID string) (Claim, error) {
	// The upsert runs only when the key is not visible to the statement's snapshot. ON CONFLICT
	// DO UPDATE (a no-op update) rather than DO NOTHING: DO NOTHING + SELECT would miss a row
	// committed after this statement's snapshot, while DO UPDATE waits for the claimer, locks and
	// returns the latest committed row. xmax = 0 only on a freshly inserted tuple.
	const sql = `
WITH existing AS (
	SELECT job_id, fingerprint FROM idempotency_keys WHERE tenant = $1 AND key = $2
), claimed AS (
	INSERT INTO idempotency_keys (tenant, key, fingerprint, job_id)
	SELECT $1::text, $2::text, $3::text, $4::uuid WHERE NOT EXISTS (SELECT FROM existing)
	ON CONFLICT (tenant, key) DO UPDATE SET tenant = excluded.tenant
	RETURNING job_id, fingerprint, (xmax = 0) AS inserted
)
SELECT job_id::text, fingerprint, inserted FROM claimed
UNION ALL
SELECT job_id::text, fingerprint, false FROM existing`
	var c Claim
	if err := q.QueryRow(ctx, sql, tenant, key, fingerprint, jobID).Scan(&c.JobID, &c.Fingerprint, &c.Claimed); err != nil {
		return Claim{}, fmt.Errorf("claim idempotency key: %w", err)
	}
	return c, nil
}
