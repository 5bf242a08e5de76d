package tenant

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/llmq/llmq/internal/secrettoken"
)

// Store keeps tenants in Postgres (table tenants, migration 006). It is safe for concurrent use.
type Store struct {
	pool   *pgxpool.Pool
	random io.Reader
}

// StoreConfig configures a Store.
type StoreConfig struct {
	// Random is the source of tokens. Default crypto/rand; tests may make tokens predictable.
	Random io.Reader
}

// NewStore returns a Store on a migrated pool. cfg may be nil.
func NewStore(pool *pgxpool.Pool, cfg *StoreConfig) *Store {
	s := &Store{pool: pool}
	if cfg != nil {
		s.random = cfg.Random
	}
	return s
}

const tenantColumns = `name, credentials, created_at, revoked_at, weight`

func scanTenant(row pgx.Row) (*Tenant, error) { return scanTenantWith(row) }

// scanTenantWith scans tenantColumns and then the row's further columns into more.
func scanTenantWith(row pgx.Row, more ...any) (*Tenant, error) {
	var t Tenant
	if err := row.Scan(append([]any{&t.Name, &t.Credentials, &t.CreatedAt, &t.RevokedAt, &t.Weight}, more...)...); err != nil {
		return nil, err
	}
	return &t, nil
}

// Create stores a new tenant and returns it with its bearer token, which exists nowhere else:
// only its SHA-256 is stored. credentials, when not nil, are the only credentials its jobs may
// use (their existence in the config is the caller's to check). Errors: ErrInvalidName,
// ErrExists (also for a name that differs from an existing tenant's, revoked or not, only in
// case, which it names: two tenants an operator could not tell apart), or a wrapped database
// error.
func (s *Store) Create(ctx context.Context, name string, credentials []string) (*Tenant, string, error) {
	return s.CreateWeighted(ctx, name, credentials, DefaultWeight)
}

// CreateWeighted is Create with the tenant's weight (see Tenant.Weight); a weight outside
// 1..MaxWeight is ErrInvalidWeight.
func (s *Store) CreateWeighted(ctx context.Context, name string, credentials []string, weight int) (*Tenant, string, error) {
	if err := checkWeight(weight); err != nil {
		return nil, "", err
	}
	if !ValidName(name) {
		return nil, "", fmt.Errorf("%w: tenant %q must be 1-64 letters, digits, '_', '.' or '-'", ErrInvalidName, truncate(name, 70))
	}
	if err := checkCredentials(credentials); err != nil {
		return nil, "", err
	}
	token, err := secrettoken.New(s.random, BearerTokenPrefix)
	if err != nil {
		return nil, "", err
	}
	hash, err := HashBearerToken(token)
	if err != nil {
		return nil, "", fmt.Errorf("new token: %w", err) // a bug: secrettoken.New makes well-formed tokens
	}
	var t *Tenant
	err = pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		// Creates of names equal but for case wait for each other here, so the read below (a
		// statement of its own: a snapshot taken once the lock is held) sees the other's row.
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1, hashtext(lower($2)))`, nameLockClass, name); err != nil {
			return err
		}
		var other string
		err := tx.QueryRow(ctx, `SELECT name FROM tenants WHERE lower(name) = lower($1) AND name <> $1 LIMIT 1`,
			name).Scan(&other)
		switch {
		case err == nil:
			return fmt.Errorf("%w: %q differs from tenant %q only in case", ErrExists, name, other)
		case !errors.Is(err, pgx.ErrNoRows):
			return err
		}
		t, err = scanTenant(tx.QueryRow(ctx, `
INSERT INTO tenants (name, token_sha256, credentials, weight) VALUES ($1, $2, $3, $4)
RETURNING `+tenantColumns, name, hash[:], credentials, weight))
		return err
	})
	if err != nil {
		var pgErr *pgconn.PgError
		switch {
		case errors.Is(err, ErrExists):
			return nil, "", err
		case errors.As(err, &pgErr) && pgErr.Code == "23505" && pgErr.ConstraintName == "tenants_pkey":
			return nil, "", fmt.Errorf("%w: %q", ErrExists, name)
		}
		return nil, "", fmt.Errorf("create tenant: %w", err)
	}
	return t, token, nil
}

// nameLockClass is the first key of the advisory locks Create takes on a name ("lqtn"), the
// second a hash of the name in lower case.
const nameLockClass int32 = 0x6c71746e

// Revoke marks the tenant revoked: its token answers ErrRevoked from then on (after the
// Authenticator's TTL on API replicas that cached it). wasActive is false when it was revoked
// already. Errors: ErrNotFound (also for a name no tenant can have) or a wrapped database error.
func (s *Store) Revoke(ctx context.Context, name string) (wasActive bool, err error) {
	if !ValidName(name) {
		// Not looked up: a name that is not UTF-8 or holds NUL would fail the query.
		return false, fmt.Errorf("%w: %q", ErrNotFound, truncate(name, 70))
	}
	tag, err := s.pool.Exec(ctx, `UPDATE tenants SET revoked_at = now() WHERE name = $1 AND revoked_at IS NULL`, name)
	if err != nil {
		return false, fmt.Errorf("revoke tenant: %w", err)
	}
	if tag.RowsAffected() == 1 {
		return true, nil
	}
	// Revoked already, or absent: revocation is never undone, so this read cannot be stale in a
	// way that matters.
	var exists bool
	if err := s.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM tenants WHERE name = $1)`, name).Scan(&exists); err != nil {
		return false, fmt.Errorf("revoke tenant: %w", err)
	}
	if !exists {
		return false, fmt.Errorf("%w: %q", ErrNotFound, name)
	}
	return false, nil
}

// SetWeight changes the tenant's weight (see Tenant.Weight); workers apply it within
// WeightCacheTTL. Errors: ErrInvalidWeight, ErrNotFound (also for a name no tenant can have), or
// a wrapped database error.
func (s *Store) SetWeight(ctx context.Context, name string, weight int) error {
	if err := checkWeight(weight); err != nil {
		return err
	}
	if !ValidName(name) {
		return fmt.Errorf("%w: %q", ErrNotFound, truncate(name, 70))
	}
	tag, err := s.pool.Exec(ctx, `UPDATE tenants SET weight = $2 WHERE name = $1`, name, weight)
	if err != nil {
		return fmt.Errorf("set tenant weight: %w", err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("%w: %q", ErrNotFound, name)
	}
	return nil
}

// Weight returns the tenant's weight: DefaultWeight for a name with no row (the anonymous
// tenant Default, or a tenant deleted since its jobs were submitted). Errors: a wrapped database
// error.
func (s *Store) Weight(ctx context.Context, name string) (int, error) {
	var w int
	err := s.pool.QueryRow(ctx, `SELECT weight FROM tenants WHERE name = $1`, name).Scan(&w)
	if errors.Is(err, pgx.ErrNoRows) {
		return DefaultWeight, nil
	}
	if err != nil {
		return 0, fmt.Errorf("tenant weight: %w", err)
	}
	return w, nil
}

// weightAmong returns the tenant's weight, as Weight does, and whether a tenant other than
// Default, not revoked, is stored (the deployment may have several tenants), in one statement.
func (s *Store) weightAmong(ctx context.Context, name string) (w int, several bool, err error) {
	var stored *int
	err = s.pool.QueryRow(ctx, `SELECT (SELECT weight FROM tenants WHERE name = $1),
	EXISTS (SELECT 1 FROM tenants WHERE name <> $2 AND revoked_at IS NULL)`, name, Default).Scan(&stored, &several)
	if err != nil {
		return 0, false, fmt.Errorf("tenant weight: %w", err)
	}
	if stored == nil {
		return DefaultWeight, several, nil
	}
	return *stored, several, nil
}

// Get returns the tenant of that name, revoked or not. Errors: ErrNotFound (also for a name no
// tenant can have) or a wrapped database error.
func (s *Store) Get(ctx context.Context, name string) (*Tenant, error) {
	if !ValidName(name) {
		return nil, fmt.Errorf("%w: %q", ErrNotFound, truncate(name, 70))
	}
	t, err := scanTenant(s.pool.QueryRow(ctx, `SELECT `+tenantColumns+` FROM tenants WHERE name = $1`, name))
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("%w: %q", ErrNotFound, name)
	}
	if err != nil {
		return nil, fmt.Errorf("get tenant: %w", err)
	}
	return t, nil
}

// List returns every tenant, revoked ones included, by name, with the end of its rotation's
// overlap while it lasts (PreviousTokenEndsAt). Tokens are not stored, so none is returned.
func (s *Store) List(ctx context.Context) ([]Tenant, error) {
	rows, err := s.pool.Query(ctx, `SELECT `+tenantColumns+`,
  (SELECT max(p.expires_at) FROM tenant_previous_tokens p WHERE p.tenant = tenants.name AND p.expires_at > now())
FROM tenants ORDER BY name`)
	if err != nil {
		return nil, fmt.Errorf("list tenants: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Tenant, error) {
		var ends *time.Time
		t, err := scanTenantWith(r, &ends)
		if err != nil {
			return Tenant{}, err
		}
		if ends != nil && t.Revoked() {
			ends = nil // a revocation ended it
		}
		t.PreviousTokenEndsAt = ends
		return *t, nil
	})
	if err != nil {
		return nil, fmt.Errorf("list tenants: %w", err)
	}
	return out, nil
}

// Lookup returns the tenant whose token has this SHA-256, revoked or not: its current token, or
// one a rotation replaced while that rotation's overlap lasts. Errors: ErrUnknownBearerToken;
// ErrRotatedOut (with the tenant) for a token replaced by a rotation whose overlap has ended,
// unless the tenant was revoked (then the tenant, as for its current token); or a wrapped
// database error. Whether an overlap has ended is Postgres's now(), as for revocations: the
// clocks of the rotating process and of this one play no part.
func (s *Store) Lookup(ctx context.Context, hash [32]byte) (*Tenant, error) {
	var t Tenant
	var leftMicros *int64 // of the overlap, for a replaced token; NULL for a current one
	err := s.pool.QueryRow(ctx, `
SELECT `+tenantColumns+`, NULL::bigint FROM tenants WHERE token_sha256 = $1
UNION ALL
SELECT t.name, t.credentials, t.created_at, t.revoked_at, t.weight,
       greatest(0, ceil(extract(epoch FROM p.expires_at - now()) * 1000000))::bigint
FROM tenant_previous_tokens p JOIN tenants t ON t.name = p.tenant WHERE p.token_sha256 = $1
LIMIT 1`, hash[:]).Scan(&t.Name, &t.Credentials, &t.CreatedAt, &t.RevokedAt, &t.Weight, &leftMicros)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, ErrUnknownBearerToken
	}
	if err != nil {
		return nil, fmt.Errorf("look up bearer token: %w", err)
	}
	if leftMicros != nil {
		t.replaced, t.tokenLeft = true, time.Duration(*leftMicros)*time.Microsecond
		if !t.Revoked() && t.tokenLeft <= 0 {
			return &t, ErrRotatedOut
		}
	}
	return &t, nil
}

// DeleteRotatedOut deletes up to limit of the tokens replaced by a rotation whose overlap ended
// before before, and returns how many it deleted: a client still sending one then hears
// ErrUnknownBearerToken, no longer ErrRotatedOut. The table holds a row per rotation and is read
// whole (its index leads with the tenant); the rows it deletes are read by Lookup only, which
// takes no lock, and a rotation changes only the rows of overlaps not ended, so it waits on
// nothing but a concurrent tenant delete. Errors: a wrapped database error.
func (s *Store) DeleteRotatedOut(ctx context.Context, before time.Time, limit int) (int64, error) {
	tag, err := s.pool.Exec(ctx, `
DELETE FROM tenant_previous_tokens WHERE token_sha256 IN (
	SELECT token_sha256 FROM tenant_previous_tokens WHERE expires_at < $1 LIMIT $2)`, before, limit)
	if err != nil {
		return 0, fmt.Errorf("delete rotated-out tokens: %w", err)
	}
	return tag.RowsAffected(), nil
}

// Rotation is the outcome of Store.Rotate.
type Rotation struct {
	// Tenant is the tenant as stored.
	Tenant *Tenant
	// Token is the new bearer token, which exists nowhere else (only its SHA-256 is stored).
	Token string
	// PreviousEnds is when the token it replaced stops authenticating (the end of the overlap),
	// on Postgres's clock.
	PreviousEnds time.Time
	// Ended is how many older tokens, still in the overlap of an earlier rotation, it ended at
	// once.
	Ended int
}

// Rotate gives the tenant a new bearer token. The token it replaces keeps authenticating for
// overlap (0: not at all), then answers ErrRotatedOut; a token still in the overlap of an earlier
// rotation ends at once, so that a tenant has at most two working tokens and rotating twice ends
// every token but the newest. Errors: ErrInvalidOverlap (outside 0..MaxOverlap), ErrNotFound
// (also for a name no tenant can have), ErrRevoked (a revoked tenant gets no new token), or a
// wrapped database error. The overlap starts at Postgres's now(), whatever this process's
// clock says (a ctl on a laptop whose clock is ahead does not lengthen it). API replicas that
// cached the replaced token see the overlap's end within their Authenticator's TTL.
func (s *Store) Rotate(ctx context.Context, name string, overlap time.Duration) (*Rotation, error) {
	if overlap < 0 || overlap > MaxOverlap {
		return nil, fmt.Errorf("%w: %s (want 0..%s)", ErrInvalidOverlap, overlap, MaxOverlap)
	}
	if !ValidName(name) {
		return nil, fmt.Errorf("%w: %q", ErrNotFound, truncate(name, 70))
	}
	token, err := secrettoken.New(s.random, BearerTokenPrefix)
	if err != nil {
		return nil, err
	}
	hash, err := HashBearerToken(token)
	if err != nil {
		return nil, fmt.Errorf("new token: %w", err) // a bug: secrettoken.New makes well-formed tokens
	}
	r := &Rotation{Token: token}
	err = pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		var old []byte
		t, err := scanTenantWith(tx.QueryRow(ctx, `SELECT `+tenantColumns+`, token_sha256 FROM tenants WHERE name = $1 FOR UPDATE`, name), &old)
		if errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("%w: %q", ErrNotFound, name)
		}
		if err != nil {
			return err
		}
		if t.Revoked() {
			return fmt.Errorf("%w: %q gets no new token (create a tenant of another name)", ErrRevoked, name)
		}
		tag, err := tx.Exec(ctx, `UPDATE tenant_previous_tokens SET expires_at = greatest(now(), rotated_at)
WHERE tenant = $1 AND expires_at > now()`, name)
		if err != nil {
			return err
		}
		r.Ended = int(tag.RowsAffected())
		if err := tx.QueryRow(ctx, `INSERT INTO tenant_previous_tokens (token_sha256, tenant, rotated_at, expires_at)
VALUES ($1, $2, now(), now() + $3 * interval '1 microsecond') RETURNING expires_at`,
			old, name, overlap.Microseconds()).Scan(&r.PreviousEnds); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `UPDATE tenants SET token_sha256 = $2 WHERE name = $1`, name, hash[:]); err != nil {
			return err
		}
		r.Tenant = t
		return nil
	})
	if errors.Is(err, ErrNotFound) || errors.Is(err, ErrRevoked) {
		return nil, err
	}
	if err != nil {
		return nil, fmt.Errorf("rotate tenant token: %w", err)
	}
	return r, nil
}

// Authenticate returns the token's tenant. Errors: ErrMalformedBearerToken, ErrUnknownBearerToken,
// ErrRevoked or ErrRotatedOut (with the tenant, for logging), or a wrapped database error. It
// does not cache; see Authenticator.
func (s *Store) Authenticate(ctx context.Context, token string) (*Tenant, error) {
	hash, err := HashBearerToken(token)
	if err != nil {
		return nil, err
	}
	t, err := s.Lookup(ctx, hash)
	if err != nil {
		return t, err // the tenant with ErrRotatedOut, else nil
	}
	if t.Revoked() {
		return t, ErrRevoked
	}
	return t, nil
}

// RevokedFor returns how long ago the tenant was revoked, on Postgres's clock (which wrote
// revoked_at): an API replica that cached it as active sees the revocation within its
// Authenticator's TTL of it. Errors: ErrNotFound (also for a name no tenant can have),
// ErrNotRevoked, or a wrapped database error.
func (s *Store) RevokedFor(ctx context.Context, name string) (time.Duration, error) {
	if !ValidName(name) {
		return 0, fmt.Errorf("%w: %q", ErrNotFound, truncate(name, 70))
	}
	var micros *int64
	err := s.pool.QueryRow(ctx, `SELECT (extract(epoch FROM now() - revoked_at) * 1000000)::bigint FROM tenants WHERE name = $1`,
		name).Scan(&micros)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, fmt.Errorf("%w: %q", ErrNotFound, name)
	}
	if err != nil {
		return 0, fmt.Errorf("read tenant revocation: %w", err)
	}
	if micros == nil {
		return 0, fmt.Errorf("%w: %q", ErrNotRevoked, name)
	}
	return time.Duration(*micros) * time.Microsecond, nil
}

// DeletedChannel is the Postgres NOTIFY channel on which Delete announces a deleted tenant, its
// name the payload, when the delete commits: an API process drops the tenant's metric series
// (those of its refusals) on it. A process that was not listening then (its connection down, or
// of a release before this channel) keeps them until it restarts.
const DeletedChannel = "llmq_tenant_deleted"

// Delete deletes a revoked tenant that has no job stored any more (see jobs.Store's
// DeleteEndedOfTenant), with its tokens, current and rotated out: a token of it answers
// ErrUnknownBearerToken from then on (after the Authenticator's TTL on replicas that cached it as
// revoked), and its name may be given to a new tenant. The audit log's entries naming it are
// kept. Errors: ErrNotFound (also for a name no tenant can have), ErrAnonymousTenant (Default),
// ErrNotRevoked, ErrHasJobs, or a wrapped database error. The delete is announced on
// DeletedChannel.
//
// The tenant's row is locked while its jobs are counted; a job submitted after that would be
// one a replica accepted with the tenant cached as active: callers delete at least the
// Authenticator's TTL after the revocation (see RevokedFor).
func (s *Store) Delete(ctx context.Context, name string) error {
	if !ValidName(name) {
		return fmt.Errorf("%w: %q", ErrNotFound, truncate(name, 70))
	}
	if name == Default {
		return fmt.Errorf("%w: %q answers anonymous requests as stored (api.allow_anonymous): deleted, they would be let in again", ErrAnonymousTenant, name)
	}
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		var revoked, hasJobs bool
		err := tx.QueryRow(ctx, `SELECT revoked_at IS NOT NULL, EXISTS (SELECT 1 FROM jobs WHERE tenant = $1)
FROM tenants WHERE name = $1 FOR UPDATE`, name).Scan(&revoked, &hasJobs)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
			return fmt.Errorf("%w: %q", ErrNotFound, name)
		case err != nil:
			return err
		case !revoked:
			return fmt.Errorf("%w: %q (revoke it first)", ErrNotRevoked, name)
		case hasJobs:
			return fmt.Errorf("%w: %q", ErrHasJobs, name)
		}
		// Keys went with their jobs (their foreign key's cascade); should one be left, it must
		// not answer a resubmit of a new tenant of this name with a job of the old one's.
		if _, err := tx.Exec(ctx, `DELETE FROM idempotency_keys WHERE tenant = $1`, name); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `DELETE FROM tenant_previous_tokens WHERE tenant = $1`, name); err != nil {
			return err
		}
		// Announced in the deleting transaction (DeletedChannel): API processes drop the
		// tenant's metric series on it.
		_, err = tx.Exec(ctx, `
WITH d AS (DELETE FROM tenants WHERE name = $1 RETURNING name)
SELECT pg_notify($2, name) FROM d`, name, DeletedChannel)
		return err
	})
	if errors.Is(err, ErrNotFound) || errors.Is(err, ErrNotRevoked) || errors.Is(err, ErrHasJobs) {
		return err
	}
	if err != nil {
		return fmt.Errorf("delete tenant: %w", err)
	}
	return nil
}
