package retrypolicy_test

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/retrypolicy"
)

var testNow = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

func header(kv ...string) http.Header {
	h := http.Header{}
	for i := 0; i < len(kv); i += 2 {
		h.Add(kv[i], kv[i+1])
	}
	return h
}

func TestParseRetryAfter(t *testing.T) {
	t.Parallel()

	tests := []struct {
		name   string
		header http.Header
		want   time.Duration
		wantOK bool
	}{
		{"NilHeader", nil, 0, false},
		{"Absent", header("Content-Type", "application/json"), 0, false},
		{"Empty", header("Retry-After", ""), 0, false},
		{"Seconds", header("Retry-After", "2"), 2 * time.Second, true},
		{"SecondsZero", header("Retry-After", "0"), 0, true},
		{"SecondsWithSpaces", header("Retry-After", "  7 "), 7 * time.Second, true},
		{"SecondsDecimal", header("Retry-After", "1.5"), 1500 * time.Millisecond, true},
		{"SecondsLeadingDot", header("Retry-After", ".25"), 250 * time.Millisecond, true},
		{"SecondsNegative", header("Retry-After", "-1"), 0, false},
		{"SecondsPlusSign", header("Retry-After", "+1"), 0, false},
		{"SecondsExponent", header("Retry-After", "1e3"), 0, false},
		{"SecondsHex", header("Retry-After", "0x10"), 0, false},
		{"SecondsInf", header("Retry-After", "Inf"), 0, false},
		{"SecondsNaN", header("Retry-After", "NaN"), 0, false},
		{"SecondsTwoDots", header("Retry-After", "1.2.3"), 0, false},
		{"OnlyDot", header("Retry-After", "."), 0, false},
		{"Garbage", header("Retry-After", "soon"), 0, false},
		{"SecondsHugeClamped", header("Retry-After", "86400"), retrypolicy.MaxRetryAfter, true},
		{"SecondsOverflowClamped", header("Retry-After", "99999999999999999999999999999"), retrypolicy.MaxRetryAfter, true},
		{"SecondsOutOfFloatRangeClamped", header("Retry-After", "1"+strings.Repeat("9", 400)), retrypolicy.MaxRetryAfter, true},
		{"SecondsJustBelowClamp", header("Retry-After", "3599"), 3599 * time.Second, true},
		{"DateIMFFixdate", header("Retry-After", testNow.Add(30*time.Second).Format(http.TimeFormat)), 30 * time.Second, true},
		{"DateRFC850", header("Retry-After", testNow.Add(45*time.Second).Format(time.RFC850)), 45 * time.Second, true},
		{"DateANSIC", header("Retry-After", testNow.Add(90*time.Second).Format(time.ANSIC)), 90 * time.Second, true},
		{"DatePast", header("Retry-After", testNow.Add(-time.Hour).Format(http.TimeFormat)), 0, true},
		{"DateNow", header("Retry-After", testNow.Format(http.TimeFormat)), 0, true},
		{"DateFarFutureClamped", header("Retry-After", testNow.AddDate(1, 0, 0).Format(http.TimeFormat)), retrypolicy.MaxRetryAfter, true},
		{"DateGarbage", header("Retry-After", "Sun, 99 Foo 2026 25:61:00 GMT"), 0, false},
		// The date is the provider's clock: it is measured from the response's Date (the same
		// clock), so that a host whose clock runs ahead of the provider's (here by 5 s) does not
		// wait less than asked, and send again into the limit.
		{"DateFromResponseDate", header("Retry-After", testNow.Add(25*time.Second).Format(http.TimeFormat),
			"Date", testNow.Add(-5*time.Second).Format(http.TimeFormat)), 30 * time.Second, true},
		{"DateFromResponseDateBehind", header("Retry-After", testNow.Add(35*time.Second).Format(http.TimeFormat),
			"Date", testNow.Add(5*time.Second).Format(http.TimeFormat)), 30 * time.Second, true},
		{"DateBadResponseDateFromNow", header("Retry-After", testNow.Add(30*time.Second).Format(http.TimeFormat),
			"Date", "yesterday"), 30 * time.Second, true},
		{"Ms", header("Retry-After-Ms", "1500"), 1500 * time.Millisecond, true},
		{"MsDecimal", header("Retry-After-Ms", "20.5"), 20500 * time.Microsecond, true},
		{"MsZero", header("Retry-After-Ms", "0"), 0, true},
		{"MsExponent", header("Retry-After-Ms", "1e99"), 0, false},
		{"MsFractionOfMs", header("Retry-After-Ms", "0.5"), 500 * time.Microsecond, true},
		{"MsLargeClamped", header("Retry-After-Ms", "360000000"), retrypolicy.MaxRetryAfter, true},
		{"MsNegative", header("Retry-After-Ms", "-5"), 0, false},
		{"MsWinsOverSeconds", header("Retry-After-Ms", "250", "Retry-After", "3"), 250 * time.Millisecond, true},
		{"MsWinsOverDate", header("Retry-After-Ms", "250", "Retry-After", testNow.Add(time.Minute).Format(http.TimeFormat)), 250 * time.Millisecond, true},
		{"InvalidMsFallsBackToSeconds", header("Retry-After-Ms", "abc", "Retry-After", "3"), 3 * time.Second, true},
		// Two header lines, the first empty (a proxy's): the hint is the first value that says
		// something, not "present but malformed".
		{"SecondLineAfterEmpty", header("Retry-After", "", "Retry-After", "7"), 7 * time.Second, true},
		{"TwoLinesFirstWins", header("Retry-After", "3", "Retry-After", "9"), 3 * time.Second, true},
		{"InvalidBoth", header("Retry-After-Ms", "abc", "Retry-After", "xyz"), 0, false},
		{"LowercaseNonCanonicalKeys", http.Header{"retry-after-ms": {"40"}}, 40 * time.Millisecond, true},
		{"LowercaseRetryAfter", http.Header{"retry-after": {"4"}}, 4 * time.Second, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()

			got, ok := retrypolicy.ParseRetryAfter(tt.header, testNow)
			require.Equal(t, tt.wantOK, ok)
			require.Equal(t, tt.want, got)
		})
	}
}

func FuzzParseRetryAfter(f *testing.F) {
	f.Add("", "2", int64(0))
	f.Add("1500", "", int64(0))
	f.Add("", "1.5", int64(0))
	f.Add("", "-1", int64(0))
	f.Add("", "Sun, 06 Nov 1994 08:49:37 GMT", testNow.Unix())
	f.Add("", "Sunday, 06-Nov-94 08:49:37 GMT", int64(0))
	f.Add("", "Sun Nov  6 08:49:37 1994", int64(0))
	f.Add("1e400", "99999999999999999999999", int64(-1))
	f.Add("NaN", "Inf", int64(1<<62))
	f.Fuzz(func(t *testing.T, ms, ra string, nowUnix int64) {
		h := http.Header{}
		if ms != "" {
			h.Set("Retry-After-Ms", ms)
		}
		if ra != "" {
			h.Set("Retry-After", ra)
		}
		d, ok := retrypolicy.ParseRetryAfter(h, time.Unix(nowUnix, 0))
		if d < 0 || d > retrypolicy.MaxRetryAfter {
			t.Fatalf("ParseRetryAfter(ms=%q, ra=%q) = %v, outside [0, %v]", ms, ra, d, retrypolicy.MaxRetryAfter)
		}
		if !ok && d != 0 {
			t.Fatalf("ParseRetryAfter(ms=%q, ra=%q) = %v, false; want 0 when not ok", ms, ra, d)
		}
		if ok && ra == "" && strings.Trim(strings.TrimSpace(ms), "0123456789.") != "" {
			// Only plain decimals are hints: no sign, exponent, hex, NaN or Inf.
			t.Fatalf("ParseRetryAfter(ms=%q) accepted a value that is not a plain decimal", ms)
		}
	})
}
