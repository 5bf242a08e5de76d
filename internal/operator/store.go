package operator

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

// Store keeps operators and sessions in Postgres (migration 015). It is safe for concurrent use.
type Store struct {
	pool   *pgxpool.Pool
	random io.Reader
	now    func() time.Time
}

// StoreConfig configures a Store.
type StoreConfig struct {
	// Random is the source of tokens. Default crypto/rand.
	Random io.Reader
	// Now is the clock of session expiry. Default time.Now.
	Now func() time.Time
}

// NewStore returns a Store on a migrated pool. cfg may be nil.
func NewStore(pool *pgxpool.Pool, cfg *StoreConfig) *Store {
	s := &Store{pool: pool, now: time.Now}
	if cfg != nil {
		s.random = cfg.Random
		if cfg.Now != nil {
			s.now = cfg.Now
		}
	}
	return s
}

const operatorColumns = `name, created_at, revoked_at`

func scanOperator(row pgx.Row) (*Operator, error) {
	var o Operator
	if err := row.Scan(&o.Name, &o.CreatedAt, &o.RevokedAt); err != nil {
		return nil, err
	}
	return &o, nil
}

// Create stores a new operator and returns it with its token, which exists nowhere else: only
// its SHA-256 is stored. Errors: ErrInvalidName, ErrExists, or a wrapped database error.
func (s *Store) Create(ctx context.Context, name string) (*Operator, string, error) {
	if !ValidName(name) {
		return nil, "", fmt.Errorf("%w: %q must be 1-64 letters, digits, '_', '.' or '-'", ErrInvalidName, truncate(name, 70))
	}
	token, err := secrettoken.New(s.random, TokenPrefix)
	if err != nil {
		return nil, "", err
	}
	hash, err := HashToken(token)
	if err != nil {
		return nil, "", fmt.Errorf("new operator token: %w", err) // a bug: secrettoken.New makes well-formed tokens
	}
	o, err := scanOperator(s.pool.QueryRow(ctx, `
INSERT INTO operators (name, token_sha256) VALUES ($1, $2) RETURNING `+operatorColumns, name, hash[:]))
	if err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "23505" && pgErr.ConstraintName == "operators_pkey" {
			return nil, "", fmt.Errorf("%w: %q", ErrExists, name)
		}
		return nil, "", fmt.Errorf("create operator: %w", err)
	}
	return o, token, nil
}

// Revoke marks the operator revoked and ends its sessions, in one transaction: its token and
// its open consoles are refused from then on. wasActive is false when it was revoked already.
// Errors: ErrNotFound or a wrapped database error.
func (s *Store) Revoke(ctx context.Context, name string) (wasActive bool, err error) {
	err = pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		var revoked *time.Time
		err := tx.QueryRow(ctx, `SELECT revoked_at FROM operators WHERE name = $1 FOR UPDATE`, name).Scan(&revoked)
		if errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("%w: %q", ErrNotFound, name)
		}
		if err != nil {
			return err
		}
		if revoked != nil {
			return nil
		}
		wasActive = true
		if _, err := tx.Exec(ctx, `UPDATE operators SET revoked_at = now() WHERE name = $1`, name); err != nil {
			return err
		}
		_, err = tx.Exec(ctx, `DELETE FROM operator_sessions WHERE operator = $1`, name)
		return err
	})
	if err != nil && !errors.Is(err, ErrNotFound) {
		return false, fmt.Errorf("revoke operator: %w", err)
	}
	return wasActive, err
}

// List returns every operator, revoked ones included, by name.
func (s *Store) List(ctx context.Context) ([]Operator, error) {
	rows, err := s.pool.Query(ctx, `SELECT `+operatorColumns+` FROM operators ORDER BY name`)
	if err != nil {
		return nil, fmt.Errorf("list operators: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Operator, error) {
		o, err := scanOperator(r)
		if err != nil {
			return Operator{}, err
		}
		return *o, nil
	})
	if err != nil {
		return nil, fmt.Errorf("list operators: %w", err)
	}
	return out, nil
}

// Authenticate returns the token's operator. Errors: ErrMalformedToken, ErrUnknownToken,
// ErrRevoked (a *RevokedError, returned with the operator), or a wrapped database error.
func (s *Store) Authenticate(ctx context.Context, token string) (*Operator, error) {
	hash, err := HashToken(token)
	if err != nil {
		return nil, err
	}
	o, err := scanOperator(s.pool.QueryRow(ctx, `SELECT `+operatorColumns+` FROM operators WHERE token_sha256 = $1`, hash[:]))
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, ErrUnknownToken
	}
	if err != nil {
		return nil, fmt.Errorf("authenticate operator: %w", err)
	}
	if o.RevokedAt != nil {
		return o, &RevokedError{Operator: o.Name}
	}
	return o, nil
}
