package limiter

import (
	"math"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestParseTokenLimits reads the scripts' token limits as strings.SplitN and strings.Fields read
// them: at most three comma-separated triples (the third holding any further commas), each of
// exactly three fields split by any white space, else left unknown; a number that does not parse
// is 0, one out of range ±Inf (strconv.ParseFloat's value).
func TestParseTokenLimits(t *testing.T) {
	t.Parallel()
	learned := func(c, r float64) TokenBucket { return TokenBucket{PerMinute: c, Rate: r, Source: SourceLearned} }
	for _, tc := range []struct {
		name, in string
		want     TokenBuckets
	}{
		{name: "Empty", in: ""},
		{name: "Three", in: "400000 6666.5 learned,0 0 unknown,2e6 33333.3 configured",
			want: TokenBuckets{Input: learned(400000, 6666.5), Output: TokenBucket{Source: SourceUnknown},
				Combined: TokenBucket{PerMinute: 2e6, Rate: 33333.3, Source: SourceConfigured}}},
		{name: "One", in: "1 2 learned", want: TokenBuckets{Input: learned(1, 2)}},
		{name: "Two", in: "1 2 learned,3 4 learned", want: TokenBuckets{Input: learned(1, 2), Output: learned(3, 4)}},
		{name: "Commas", in: ",,", want: TokenBuckets{}},
		{name: "MoreCommasInTheThird", in: "1 2 learned,3 4 learned,5 6 learned,7 8 learned",
			want: TokenBuckets{Input: learned(1, 2), Output: learned(3, 4)}},
		{name: "ExtraSpaces", in: "  1\t2 \n learned , 3  4  learned\r,\v5 6 learned\u00a0",
			want: TokenBuckets{Input: learned(1, 2), Output: learned(3, 4), Combined: learned(5, 6)}},
		{name: "TwoFields", in: "1 2,3 4 learned", want: TokenBuckets{Output: learned(3, 4)}},
		{name: "FourFields", in: "1 2 learned x,3 4 learned", want: TokenBuckets{Output: learned(3, 4)}},
		{name: "NotNumbers", in: "x y learned,1e999 -1e999 learned,0x10 NaN z",
			want: TokenBuckets{Input: learned(0, 0), Output: learned(math.Inf(1), math.Inf(-1)),
				Combined: TokenBucket{PerMinute: 0, Rate: math.NaN(), Source: "z"}}}, // hex needs a p exponent
		{name: "UnicodeSpace", in: "1\u20032\u2003learned", want: TokenBuckets{Input: learned(1, 2)}},
		{name: "Spaces", in: "   ", want: TokenBuckets{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got := parseTokenLimits(tc.in)
			if math.IsNaN(tc.want.Combined.Rate) { // NaN equals nothing: compare it apart
				require.True(t, math.IsNaN(got.Combined.Rate))
				got.Combined.Rate, tc.want.Combined.Rate = 0, 0
			}
			require.Equal(t, tc.want, got)
		})
	}
}

// TestParseTokenLimits_Allocs: reading a reservation's token limits allocates nothing (the
// strings.SplitN and strings.Fields slices took four allocations on every reply).
func TestParseTokenLimits_Allocs(t *testing.T) { // not parallel: testing.AllocsPerRun
	s := "400000 6666.5 learned,0 0 unknown,2e6 33333.3 configured"
	var got TokenBuckets
	allocs := testing.AllocsPerRun(100, func() { got = parseTokenLimits(s) })
	require.Equal(t, SourceConfigured, got.Combined.Source)
	require.Zero(t, allocs, "allocations per parse")
}
