package llm

import (
	"encoding/base64"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"unicode"
	"unicode/utf8"
	"unsafe"
)

// redactMark replaces key material in provider text.
const redactMark = "[redacted]"

// minFormLen is the shortest encoded form of a key that is searched for (the key itself always
// is): a shorter base64 fragment would match ordinary text.
const minFormLen = 8

// minPartialLen is the shortest start of a key form that cutEnd removes from a text cut before it
// could be redacted: a shorter start ("sk-") carries nothing secret.
const minPartialLen = 4

// redactor removes one API key from text a provider sent, in every form a provider or a proxy
// may echo it: as sent and in any ASCII letter case; URL-encoded (query and path escaping); and
// base64 (standard and URL alphabets, padded or raw, and at each of the three alignments inside a
// longer base64 text, such as a whole "Bearer <key>" header encoded). Provider text is untrusted:
// everything this package puts in an error, a header or a body it returns has been through it,
// before any cut. The zero redactor (no key) only sanitises.
type redactor struct {
	forms []string // ASCII lower-cased, deduplicated, longest first
}

func newRedactor(key string) redactor {
	if key == "" {
		return redactor{}
	}
	forms := []string{key, url.QueryEscape(key), url.PathEscape(key)}
	for _, enc := range []*base64.Encoding{base64.StdEncoding, base64.URLEncoding} {
		forms = append(forms, enc.EncodeToString([]byte(key)), enc.WithPadding(base64.NoPadding).EncodeToString([]byte(key)))
		for shift := range 3 {
			forms = append(forms, base64Core(enc, key, shift))
		}
	}
	var r redactor
	for i, f := range forms {
		f = lowerASCII(f)
		if (i == 0 || len(f) >= minFormLen) && !slices.Contains(r.forms, f) {
			r.forms = append(r.forms, f)
		}
	}
	slices.SortStableFunc(r.forms, func(a, b string) int { return len(b) - len(a) })
	return r
}

// base64Core is the part of the base64 text of a longer byte string, with key starting at byte
// offset shift (mod 3), that depends on key's bytes alone: the characters before it mix in the
// preceding bytes, the one after it the following ones.
func base64Core(enc *base64.Encoding, key string, shift int) string {
	s := enc.WithPadding(base64.NoPadding).EncodeToString(append(make([]byte, shift), key...))
	from := (8*shift + 5) / 6
	to := 8 * (shift + len(key)) / 6
	if from >= to {
		return ""
	}
	return s[from:to]
}

// spans returns the sorted [start, end) ranges of s that match a form of the key, overlapping
// ones merged. Ranges that only touch (a key right after a key) stay apart: a text's ranges up
// to a point are those of any longer text with the same start, unless a match straddles the point
// (see deltaMasker).
func (r redactor) spans(s string) [][2]int {
	var out [][2]int
	for _, f := range r.forms {
		foldMatches(s, f, func(i int) { out = append(out, [2]int{i, i + len(f)}) })
	}
	if len(out) < 2 {
		return out
	}
	slices.SortFunc(out, func(a, b [2]int) int { return a[0] - b[0] })
	merged := out[:1]
	for _, sp := range out[1:] {
		last := &merged[len(merged)-1]
		if sp[0] < last[1] {
			last[1] = max(last[1], sp[1])
			continue
		}
		merged = append(merged, sp)
	}
	return merged
}

// redact replaces every form of the key in s with redactMark.
func (r redactor) redact(s string) string {
	spans := r.spans(s)
	if len(spans) == 0 {
		return s
	}
	var b strings.Builder
	b.Grow(len(s))
	at := 0
	for _, sp := range spans {
		b.WriteString(s[at:sp[0]])
		b.WriteString(redactMark)
		at = sp[1]
	}
	b.WriteString(s[at:])
	return b.String()
}

// maskBytes overwrites every form of the key in b, in place and byte for byte (redactMark, then
// '*'), so that a JSON body keeps its length and, the key being inside a string, its validity.
// It reports whether anything was masked.
func (r redactor) maskBytes(b []byte) bool {
	if len(r.forms) == 0 {
		return false
	}
	spans := r.spans(unsafeString(b))
	for _, sp := range spans {
		n := copy(b[sp[0]:sp[1]], redactMark)
		for i := sp[0] + n; i < sp[1]; i++ {
			b[i] = '*'
		}
	}
	return len(spans) > 0
}

// cutEnd removes from the end of s, a text cut from a longer one before it could be redacted,
// the start of a key form the cut split: the longest suffix of s (at least minPartialLen bytes)
// that is a proper prefix of a form, replaced by redactMark.
func (r redactor) cutEnd(s string) string {
	best := 0
	for _, f := range r.forms {
		for n := min(len(f)-1, len(s)); n >= minPartialLen && n > best; n-- {
			if equalFoldLower(s[len(s)-n:], f[:n]) {
				best = n
				break
			}
		}
	}
	if best == 0 {
		return s
	}
	return s[:len(s)-best] + redactMark
}

// startTail returns the length of the longest suffix of s that is a proper prefix of a form of
// the key (0: none): text that the text after it may complete into the key.
func (r redactor) startTail(s string) int {
	best := 0
	for _, f := range r.forms {
		for n := min(len(f)-1, len(s)); n > best; n-- {
			if equalFoldLower(s[len(s)-n:], f[:n]) {
				best = n
				break
			}
		}
	}
	return best
}

// clean makes a provider string fit to store, log and show: control characters and invalid
// UTF-8 replaced, the key redacted, then cut to at most n bytes (plus the cut mark).
func (r redactor) clean(s string, n int) string {
	return truncate(r.redact(sanitize(s)), n)
}

// excerpt is a short, single-line, valid UTF-8 prefix of an unparseable body, without the key.
// cut reports that data is the start of a longer body: a key it split is removed too. The whole
// of data (at most maxErrorBodyBytes) is redacted before it is cut: a key straddling the cut
// would otherwise survive in part.
func (r redactor) excerpt(data []byte, cut bool) string {
	const n = 200
	s := r.redact(sanitize(unsafeString(data)))        // no copy of up to 64 KiB: see the Clone below
	s = r.redact(strings.Join(strings.Fields(s), " ")) // joining may complete a key with white space in it
	if cut {
		s = r.cutEnd(s)
	}
	return strings.Clone(truncate(s, n)) // what is kept must not share data's memory
}

// header returns h with every form of the key redacted from its names and values: h itself when
// there is none (the common case costs no allocation), else a copy.
func (r redactor) header(h http.Header) http.Header {
	if len(r.forms) == 0 {
		return h
	}
	found := false
	for k, vs := range h {
		found = found || len(r.spans(k)) > 0
		for _, v := range vs {
			found = found || len(r.spans(v)) > 0
		}
	}
	if !found {
		return h
	}
	out := make(http.Header, len(h))
	for k, vs := range h {
		k = r.redact(k)
		for _, v := range vs {
			out[k] = append(out[k], r.redact(v))
		}
	}
	return out
}

// sanitize replaces invalid UTF-8 and control characters other than white space (tab, newline,
// carriage return) with U+FFFD:
// Postgres refuses NUL in text and in jsonb, and an escape sequence must not reach an operator's
// terminal through `ctl jobs show`. It replaces, never removes, so it cannot join a key's parts.
func sanitize(s string) string {
	clean := true
	for _, c := range s {
		if c == utf8.RuneError || (unicode.IsControl(c) && !isSpaceControl(c)) {
			clean = false
			break
		}
	}
	if clean {
		return s
	}
	var b strings.Builder
	b.Grow(len(s))
	for _, c := range s { // ranging over invalid UTF-8 yields utf8.RuneError per bad byte
		if unicode.IsControl(c) && !isSpaceControl(c) {
			c = utf8.RuneError
		}
		b.WriteRune(c)
	}
	return b.String()
}

func isSpaceControl(c rune) bool { return c == '\t' || c == '\n' || c == '\r' }

// foldMatches calls match with the start of every ASCII-case-insensitive occurrence of lower (an
// ASCII lower-cased pattern) in s, overlapping ones included, in order. It allocates nothing and
// runs in time linear in len(s) times the matches' length.
func foldMatches(s, lower string, match func(int)) {
	n := len(lower)
	if n == 0 || n > len(s) {
		return
	}
	c0, c1 := lower[0], lower[0]
	if 'a' <= c0 && c0 <= 'z' {
		c1 = c0 - 'a' + 'A'
	}
	last := len(s) - n // the last start that fits
	next0, next1 := -2, -2
	if c0 == c1 {
		next1 = -1
	}
	for i := 0; i <= last; {
		// Find the next start at or after i of either case of the first byte, remembering the
		// other case's position so that a long text is scanned once per case, not once per hit.
		if next0 != -1 && next0 < i {
			next0 = indexByteFrom(s[:last+1], c0, i)
		}
		if next1 != -1 && next1 < i {
			next1 = indexByteFrom(s[:last+1], c1, i)
		}
		j := next0
		if j < 0 || (next1 >= 0 && next1 < j) {
			j = next1
		}
		if j < 0 {
			return
		}
		if equalFoldLower(s[j:j+n], lower) {
			match(j)
		}
		i = j + 1
	}
}

func indexByteFrom(s string, c byte, from int) int {
	if j := strings.IndexByte(s[from:], c); j >= 0 {
		return from + j
	}
	return -1
}

// equalFoldLower reports whether s equals lower (ASCII lower-cased) ignoring ASCII case.
func equalFoldLower(s, lower string) bool {
	if len(s) != len(lower) {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		if c != lower[i] {
			return false
		}
	}
	return true
}

// unsafeString views b as a string without copying it (an answer may be 32 MiB); b must not
// change while the string is in use.
func unsafeString(b []byte) string { return unsafe.String(unsafe.SliceData(b), len(b)) }

// lowerASCII lower-cases ASCII letters only, so that byte offsets are kept.
func lowerASCII(s string) string {
	b := []byte(s)
	for i, c := range b {
		if 'A' <= c && c <= 'Z' {
			b[i] = c + 'a' - 'A'
		}
	}
	return string(b)
}
