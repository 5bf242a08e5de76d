package tenant

import (
	"context"
	"errors"
	"fmt"
	"io"

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

func scanTenant(row pgx.Row) (*Tenant, error) {
	var t Tenant
	if err := row.Scan(&t.Name, &t.Credentials, &t.CreatedAt, &t.RevokedAt, &t.Weight); err != nil {
		return nil, err
	}
	return &t, nil
}

// Create stores a new tenant and returns it with its bearer token, which exists nowhere else:
// only its SHA-256 is stored. credentials, when not nil, are the only credentials its jobs may
// use (their existence in the config is the caller's to check). Errors: ErrInvalidName,
// ErrExists, or a wrapped database error.
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
	t, err := scanTenant(s.pool.QueryRow(ctx, `
INSERT INTO tenants (name, token_sha256, credentials, weight) VALUES ($1, $2, $3, $4)
RETURNING `+tenantColumns, name, hash[:], credentials, weight))
	if err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "23505" && pgErr.ConstraintName == "tenants_pkey" {
			return nil, "", fmt.Errorf("%w: %q", ErrExists, name)
		}
		return nil, "", fmt.Errorf("create tenant: %w", err)
	}
	return t, token, nil
}

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

// List returns every tenant, revoked ones included, by name. Tokens are not stored, so none is
// returned.
func (s *Store) List(ctx context.Context) ([]Tenant, error) {
	rows, err := s.pool.Query(ctx, `SELECT `+tenantColumns+` FROM tenants ORDER BY name`)
	if err != nil {
		return nil, fmt.Errorf("list tenants: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Tenant, error) {
		t, err := scanTenant(r)
		if err != nil {
			return Tenant{}, err
		}
		return *t, nil
	})
	if err != nil {
		return nil, fmt.Errorf("list tenants: %w", err)
	}
	return out, nil
}

// Lookup returns the tenant whose token has this SHA-256, revoked or not, or ErrUnknownBearerToken.
func (s *Store) Lookup(ctx context.Context, hash [32]byte) (*Tenant, error) {
	t, err := scanTenant(s.pool.QueryRow(ctx, `SELECT `+tenantColumns+` FROM tenants WHERE token_sha256 = $1`, hash[:]))
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, ErrUnknownBearerToken
	}
	if err != nil {
		return nil, fmt.Errorf("look up bearer token: %w", err)
	}
	return t, nil
}

// Authenticate returns the token's tenant. Errors: ErrMalformedBearerToken, ErrUnknownBearerToken, ErrRevoked
// (with the tenant, for logging), or a wrapped database error. It does not cache; see
// Authenticator.
func (s *Store) Authenticate(ctx context.Context, token string) (*Tenant, error) {
	hash, err := HashBearerToken(token)
	if err != nil {
		return nil, err
	}
	t, err := s.Lookup(ctx, hash)
	if err != nil {
		return nil, err
	}
	if t.Revoked() {
		return t, ErrRevoked
	}
	return t, nil
}
