package tenant

import (
	"errors"
	"fmt"
	"regexp"
	"slices"
	"time"

	"github.com/llmq/llmq/internal/secrettoken"
)

// Errors of authentication and of the Store.
var (
	// ErrMalformedBearerToken: the bearer token does not have the shape of an llmq token.
	ErrMalformedBearerToken = errors.New("malformed bearer token")
	// ErrUnknownBearerToken: no tenant has that token.
	ErrUnknownBearerToken = errors.New("unknown bearer token")
	// ErrRevoked: the token's tenant was revoked.
	ErrRevoked = errors.New("tenant revoked")
	// ErrRotatedOut: the token was its tenant's until a rotation replaced it, and the rotation's
	// overlap has ended.
	ErrRotatedOut = errors.New("bearer token rotated out")
	// ErrInvalidOverlap: a rotation's overlap outside 0..MaxOverlap.
	ErrInvalidOverlap = errors.New("invalid overlap")
	// ErrNotRevoked: the tenant is not revoked, and only a revoked tenant may be deleted.
	ErrNotRevoked = errors.New("tenant not revoked")
	// ErrHasJobs: the tenant still has jobs stored, and a tenant is deleted after its jobs.
	ErrHasJobs = errors.New("tenant still has jobs")
	// ErrAnonymousTenant: the tenant Default is not deleted: anonymous requests (with
	// api.allow_anonymous) take it as stored, revoked included, and without its row would be let in.
	ErrAnonymousTenant = errors.New("the anonymous requests' tenant is not deleted")
	// ErrNotFound: no tenant with that name.
	ErrNotFound = errors.New("tenant not found")
	// ErrExists: a tenant with that name exists already (revoked or not).
	ErrExists = errors.New("tenant exists")
	// ErrInvalidWeight: a weight outside 1..MaxWeight.
	ErrInvalidWeight = errors.New("invalid weight")
	// ErrInvalidName: a tenant or credential name is not 1-64 letters, digits, '_', '.' or '-',
	// starting with a letter or digit.
	ErrInvalidName = errors.New("invalid name")
	// ErrDuplicateCredential: a tenant's credential list names one credential twice.
	ErrDuplicateCredential = errors.New("credential listed twice")
)

// Default is the tenant of anonymous requests when the API allows them (api.allow_anonymous):
// as stored, when an operator created a tenant of that name (see Authenticator.Named).
const Default = "default"

// BearerTokenPrefix starts every token, so that a leaked one is recognisable (secret scanners) and a
// token of another system is refused without a database lookup.
const BearerTokenPrefix = "llmq_"

var nameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$`)

// ValidName reports whether s is a valid tenant or credential name (the same rule as the
// credential names of the config file).
func ValidName(s string) bool { return nameRE.MatchString(s) }

// Tenant is one API caller.
type Tenant struct {
	Name string `json:"name"`
	// Credentials are the only credentials its jobs may use; nil: all of them.
	Credentials []string   `json:"credentials"`
	CreatedAt   time.Time  `json:"created_at"`
	RevokedAt   *time.Time `json:"revoked_at"`
	// Weight is the tenant's share of a credential against the other tenants with work waiting
	// on it: tenants of weights 2 and 1 get two slots and one. DefaultWeight unless set.
	Weight int `json:"weight"`
	// PreviousTokenEndsAt, set by Store.List only, is when the token a rotation replaced stops
	// working, while that rotation's overlap lasts (a rotation in progress: some client may
	// still use the old token); nil otherwise.
	PreviousTokenEndsAt *time.Time `json:"previous_token_ends_at,omitempty"`
	// replaced is set by Store.Lookup for a token a rotation replaced; tokenLeft is then what
	// was left of the rotation's overlap when Postgres answered (0 once it has ended).
	replaced  bool
	tokenLeft time.Duration
}

// Rotation overlaps (Store.Rotate).
const (
	// DefaultOverlap is how long a rotated-out token keeps working unless told otherwise: a day
	// for its clients to take the new one.
	DefaultOverlap = 24 * time.Hour
	// MaxOverlap bounds an overlap: a token being replaced (leaked, perhaps) does not live on
	// for months.
	MaxOverlap = 30 * 24 * time.Hour
)

// Weights of tenants.
const (
	// DefaultWeight is the weight of a tenant created without one, and of the anonymous tenant.
	DefaultWeight = 1
	// MaxWeight bounds a weight (the column's check, migration 013).
	MaxWeight = 1000
)

// checkWeight is ErrInvalidWeight for a weight outside 1..MaxWeight.
func checkWeight(w int) error {
	if w < 1 || w > MaxWeight {
		return fmt.Errorf("%w: %d (want 1..%d)", ErrInvalidWeight, w, MaxWeight)
	}
	return nil
}

// Allows reports whether the tenant's jobs may use the credential.
func (t *Tenant) Allows(credential string) bool {
	return t.Credentials == nil || slices.Contains(t.Credentials, credential)
}

// Revoked reports whether the tenant was revoked.
func (t *Tenant) Revoked() bool { return t.RevokedAt != nil }

// HashBearerToken returns the SHA-256 of a well-formed token, the only form in which it is stored or
// cached, or ErrMalformedBearerToken.
func HashBearerToken(token string) ([32]byte, error) {
	h, ok := secrettoken.Hash(token, BearerTokenPrefix)
	if !ok {
		return [32]byte{}, ErrMalformedBearerToken
	}
	return h, nil
}

// checkCredentials validates a credential list: valid names, no duplicates.
func checkCredentials(creds []string) error {
	seen := map[string]bool{}
	for _, c := range creds {
		if !ValidName(c) {
			return fmt.Errorf("%w: credential %q", ErrInvalidName, truncate(c, 70))
		}
		if seen[c] {
			return fmt.Errorf("%w: %q", ErrDuplicateCredential, c)
		}
		seen[c] = true
	}
	return nil
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
