package operator

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/llmq/llmq/internal/secrettoken"
)

// Login authenticates the operator token and opens a session of ttl. It returns the session
// token (for the cookie; only its hash is stored) and the session. Errors: those of
// Authenticate, or a wrapped database error. Expired sessions are deleted on the way.
func (s *Store) Login(ctx context.Context, token string, ttl time.Duration) (string, *Session, error) {
	o, err := s.Authenticate(ctx, token)
	if err != nil {
		return "", nil, err
	}
	sessionToken, err := secrettoken.New(s.random, "")
	if err != nil {
		return "", nil, err
	}
	csrf, err := secrettoken.New(s.random, "")
	if err != nil {
		return "", nil, err
	}
	hash, _ := hashSession(sessionToken) // well-formed: secrettoken.New made it
	now := s.now()
	sess := &Session{Operator: o.Name, CSRF: csrf, Expires: now.Add(ttl)}
	if _, err := s.pool.Exec(ctx, `DELETE FROM operator_sessions WHERE expires_at < $1`, now); err != nil {
		return "", nil, fmt.Errorf("delete expired sessions: %w", err)
	}
	// The operator's row is locked against a concurrent Revoke: a session is never left to a
	// revoked operator.
	tag, err := s.pool.Exec(ctx, `
INSERT INTO operator_sessions (token_sha256, operator, csrf_token, expires_at)
SELECT $1, name, $3, $4 FROM operators WHERE name = $2 AND revoked_at IS NULL FOR UPDATE`,
		hash[:], o.Name, csrf, sess.Expires)
	if err != nil {
		return "", nil, fmt.Errorf("open session: %w", err)
	}
	if tag.RowsAffected() == 0 {
		return "", nil, &RevokedError{Operator: o.Name}
	}
	return sessionToken, sess, nil
}

// Session returns the live session of a session token. Errors: ErrNoSession (unknown, malformed
// or expired), or a wrapped database error.
func (s *Store) Session(ctx context.Context, sessionToken string) (*Session, error) {
	hash, err := hashSession(sessionToken)
	if err != nil {
		return nil, err
	}
	var sess Session
	err = s.pool.QueryRow(ctx, `
SELECT operator, csrf_token, expires_at FROM operator_sessions WHERE token_sha256 = $1 AND expires_at > $2`,
		hash[:], s.now()).Scan(&sess.Operator, &sess.CSRF, &sess.Expires)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, ErrNoSession
	}
	if err != nil {
		return nil, fmt.Errorf("read session: %w", err)
	}
	return &sess, nil
}

// Logout ends the session of a session token; ending an unknown one is not an error.
func (s *Store) Logout(ctx context.Context, sessionToken string) error {
	hash, err := hashSession(sessionToken)
	if err != nil {
		return nil
	}
	if _, err := s.pool.Exec(ctx, `DELETE FROM operator_sessions WHERE token_sha256 = $1`, hash[:]); err != nil {
		return fmt.Errorf("end session: %w", err)
	}
	return nil
}
