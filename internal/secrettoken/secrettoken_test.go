package secrettoken_test

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"strings"
	"testing"
	"testing/iotest"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/secrettoken"
)

func TestNew_PrefixAndEncodedRandomBytes(t *testing.T) {
	s, err := secrettoken.New(bytes.NewReader(bytes.Repeat([]byte{0xff}, 32)), "llmq_")
	require.NoError(t, err)
	require.Equal(t, "llmq_"+strings.Repeat("_", 42)+"8", s)

	a, err := secrettoken.New(nil, "x_")
	require.NoError(t, err)
	b, err := secrettoken.New(nil, "x_")
	require.NoError(t, err)
	require.NotEqual(t, a, b, "crypto/rand by default")

	_, err = secrettoken.New(iotest.ErrReader(errors.New("no entropy")), "x_")
	require.ErrorContains(t, err, "no entropy")
}

func TestHash_OnlyTheShapeNewGives(t *testing.T) {
	s, err := secrettoken.New(nil, "llmqop_")
	require.NoError(t, err)
	h, ok := secrettoken.Hash(s, "llmqop_")
	require.True(t, ok)
	require.Equal(t, sha256.Sum256([]byte(s)), h)

	rest := strings.TrimPrefix(s, "llmqop_")
	for name, bad := range map[string]string{
		"other prefix":  "llmq_" + rest,
		"no prefix":     rest,
		"short":         "llmqop_" + rest[1:],
		"long":          s + "A",
		"padding":       "llmqop_" + rest[1:] + "=",
		"not base64url": "llmqop_" + rest[1:] + "+",
		"empty":         "",
	} {
		_, ok := secrettoken.Hash(bad, "llmqop_")
		require.False(t, ok, name)
	}
}
