package idem

import (
	"testing"
	"unicode/utf8"

	"github.com/llmq/llmq/internal/jsonscan"
	"github.com/stretchr/testify/require"
)

// plainCanonical is stringEnd's reference for plain, the second pass it replaced: whether s, a
// JSON string's contents (valid: no control byte, no unescaped quote), is written by
// encoding/json's encoder as it is: no escape, UTF-8, no U+2028 or U+2029.
func plainCanonical(s []byte) bool {
	for k := 0; k < len(s); k++ {
		switch b := s[k]; {
		case b == '\\':
			return false
		case b >= utf8.RuneSelf:
			r, size := utf8.DecodeRune(s[k:])
			if r == utf8.RuneError && size == 1 || r == '\u2028' || r == '\u2029' {
				return false
			}
			k += size - 1
		}
	}
	return true
}

// FuzzStringEnd: stringEnd's one pass answers as the two it replaced, jsonscan.StringEnd and
// then plainCanonical of the string's contents, at every index of any document.
func FuzzStringEnd(f *testing.F) {
	for _, s := range []string{
		`"plain"`, `"a\"b"`, `"\\"`, `"\u00e9"`, "\"é\"", "\"\u2028\"", "\"\u2029x\"",
		"\"\xff\"", "\"\xe2\x80\"", "\"a\x01\"", `"no end`, `"a\`, `"\u12"`, `x"a"`, `""`,
		"\"\xe2\x80\xa8\\n\"", "\"é\\\"\"",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, doc []byte) {
		for i := -1; i <= len(doc); i++ {
			end, plain := stringEnd(doc, i)
			want := jsonscan.StringEnd(doc, i)
			require.Equal(t, want, end, "end of the string at %d of %q", i, doc)
			if want < 0 {
				require.False(t, plain, "at %d of %q", i, doc)
				continue
			}
			require.Equal(t, plainCanonical(doc[i+1:want-1]), plain, "plain at %d of %q", i, doc)
		}
	})
}
