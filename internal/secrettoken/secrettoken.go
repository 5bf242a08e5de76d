// Package secrettoken makes and checks the bearer secrets llmq hands out (tenant API tokens,
// operator tokens, console sessions): a prefix that names the kind, then 32 random bytes in
// unpadded base64url. Only a secret's SHA-256 is ever stored, so a database dump holds no
// usable secret.
package secrettoken

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"io"
	"strings"
)

// randomBytes is the entropy of a secret.
const randomBytes = 32

// encodedLen is the length of a secret after its prefix.
var encodedLen = base64.RawURLEncoding.EncodedLen(randomBytes)

// New returns prefix followed by 32 bytes read from random (crypto/rand when nil).
func New(random io.Reader, prefix string) (string, error) {
	if random == nil {
		random = rand.Reader
	}
	var b [randomBytes]byte
	if _, err := io.ReadFull(random, b[:]); err != nil {
		return "", fmt.Errorf("read random token: %w", err)
	}
	return prefix + base64.RawURLEncoding.EncodeToString(b[:]), nil
}

// Hash returns the SHA-256 of secret, the only form in which it is stored, and true when secret
// has the shape New gives with this prefix; false (and no hash) otherwise, so a malformed or
// foreign secret is refused without a lookup.
func Hash(secret, prefix string) ([32]byte, bool) {
	rest, ok := strings.CutPrefix(secret, prefix)
	if !ok || len(rest) != encodedLen {
		return [32]byte{}, false
	}
	for _, c := range rest {
		if !(c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
			return [32]byte{}, false
		}
	}
	// Copied into a buffer on the stack: []byte(secret) of a token (over 32 bytes) was an
	// allocation at every request's authentication, its answer cached or not.
	var buf [hashBuffer]byte
	return sha256.Sum256(append(buf[:0], secret...)), true
}

// hashBuffer holds a secret of New's shape with a prefix of up to 21 bytes, copied for Hash (a
// longer one is copied to the heap).
const hashBuffer = 64
