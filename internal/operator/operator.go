package operator

import (
	"errors"
	"regexp"
	"time"

	"github.com/llmq/llmq/internal/secrettoken"
)

// Errors of the Store.
var (
	// ErrInvalidName: an operator name is not 1-64 letters, digits, '_', '.' or '-', starting
	// with a letter or digit.
	ErrInvalidName = errors.New("invalid operator name")
	// ErrExists: an operator with that name exists already (revoked or not).
	ErrExists = errors.New("operator exists")
	// ErrNotFound: no operator with that name.
	ErrNotFound = errors.New("operator not found")
	// ErrMalformedToken: the token does not have the shape of an operator token.
	ErrMalformedToken = errors.New("malformed operator token")
	// ErrUnknownToken: no operator has that token.
	ErrUnknownToken = errors.New("unknown operator token")
	// ErrRevoked: the token's operator was revoked (a *RevokedError, naming it, matches it).
	ErrRevoked = errors.New("operator revoked")
	// ErrNoSession: the session token is unknown or expired (or its operator revoked).
	ErrNoSession = errors.New("no such session")
)

// RevokedError is ErrRevoked naming the operator, for the log of a refused login: Authenticate
// and Login return it for a revoked operator's token. errors.Is(err, ErrRevoked) matches it.
type RevokedError struct {
	// Operator is the revoked operator's name.
	Operator string
}

func (e *RevokedError) Error() string { return ErrRevoked.Error() + ": " + e.Operator }

// Is reports whether target is ErrRevoked.
func (e *RevokedError) Is(target error) bool { return target == ErrRevoked }

// TokenPrefix starts every operator token. It differs from the tenants' "llmq_", so that a
// tenant token is recognised and refused without a lookup, and a leaked token is recognisable.
const TokenPrefix = "llmqop_"

var nameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$`)

// ValidName reports whether s is a valid operator name.
func ValidName(s string) bool { return nameRE.MatchString(s) }

// Operator is one person (or team) allowed into the console.
type Operator struct {
	Name      string     `json:"name"`
	CreatedAt time.Time  `json:"created_at"`
	RevokedAt *time.Time `json:"revoked_at"`
}

// Session is a console login.
type Session struct {
	// Operator is the operator's name.
	Operator string
	// CSRF is the token every action of the session must carry (header X-CSRF-Token).
	CSRF string
	// Expires is when the session ends.
	Expires time.Time
}

// HashToken returns the SHA-256 of a well-formed operator token, or ErrMalformedToken.
func HashToken(token string) ([32]byte, error) {
	h, ok := secrettoken.Hash(token, TokenPrefix)
	if !ok {
		return [32]byte{}, ErrMalformedToken
	}
	return h, nil
}

// hashSession returns the SHA-256 of a well-formed session token, or ErrNoSession.
func hashSession(token string) ([32]byte, error) {
	h, ok := secrettoken.Hash(token, "")
	if !ok {
		return [32]byte{}, ErrNoSession
	}
	return h, nil
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
