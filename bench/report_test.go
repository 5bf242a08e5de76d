package main

import (
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestFlagBounds(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-i", "0"}, "-i: must be at least 1"},
		{[]string{"-f", "0"}, "-f: must be positive"},
		{[]string{"-d", "-1s"}, "-d: must not be negative"},
		{[]string{"-m", "999us"}, "-m: must be at least 1ms"},
		{[]string{"-i", "1", "-f", "0.5", "-d", "0s", "-m", "1ms"}, ""},
	} {
		var i int
		var f float64
		var d, m time.Duration
		fs := newFlagSet("t", io.Discard)
		fs.intAtLeast(&i, "i", 1, 1, "")
		fs.positiveFloat(&f, "f", 1, "")
		fs.durationAtLeast(&d, "d", 0, 0, "")
		fs.durationAtLeast(&m, "m", time.Second, time.Millisecond, "")
		err := fs.parse(tc.args)
		if tc.want == "" {
			require.NoError(t, err)
			continue
		}
		require.ErrorContains(t, err, tc.want, tc.args)
	}
}

func TestChecks(t *testing.T) {
	t.Parallel()
	met := check{what: "429s", got: "0", target: "0", pass: true}
	missed := check{what: "last result", got: "9.00 s", target: "≤ 8.40 s", pass: false}
	shown := check{what: "p50", got: "3.00 s"}
	require.Equal(t, "PASS", verdict([]check{met, shown}))
	require.Equal(t, "FAIL", verdict([]check{met, missed}))
	require.Equal(t, "", verdict([]check{shown}), "nothing judged")
	require.Equal(t, "llmq: 429s 0 (target 0): PASS.", checksNote("llmq", []check{met, shown}))
	require.Equal(t, "llmq: 429s 0 (target 0), last result 9.00 s (target ≤ 8.40 s): FAIL (last result).",
		checksNote("llmq", []check{met, missed}))
}

func TestReport(t *testing.T) {
	t.Parallel()
	r := report{tables: []table{{[]string{"strategy", "n", "× floor"}, [][]string{{"no retry", "20/100", "0.00"}, {"a|b", "100/100", "1.01"}}}},
		notes: []string{"one", "two"}}
	require.Equal(t, "\n"+
		"strategy        n  × floor\n"+
		"--------  -------  -------\n"+
		"no retry   20/100     0.00\n"+
		"a|b       100/100     1.01\n"+
		"\n- one\n- two\n", r.text())
	h := head{command: "go run . herd -write ../docs/benchmarks.md", date: time.Date(2026, 5, 1, 0, 0, 0, 0, time.UTC), machine: "linux/amd64"}
	require.Equal(t, "`go run . herd -write ../docs/benchmarks.md` — 2026-05-01, linux/amd64.\n\n"+
		"| strategy | n | × floor |\n|---|---:|---:|\n| no retry | 20/100 | 0.00 |\n| a\\|b | 100/100 | 1.01 |\n\n- one\n- two\n", r.markdown(h))
	h.load = "1.00, 2.00, 3.00"
	require.True(t, strings.HasPrefix(r.markdown(h), "`go run . herd -write ../docs/benchmarks.md` — 2026-05-01, linux/amd64; load average 1.00, 2.00, 3.00 at the start.\n"))
	require.Equal(t, "6.88, 7.94, 8.22", loadAverage("6.88 7.94 8.22 3/412 12345\n"))
	require.Empty(t, loadAverage(""))
}

func TestReplaceSection(t *testing.T) {
	t.Parallel()
	doc := "# B\n\n## herd\n\nprose\n\n<!-- herd:begin -->\nold\n<!-- herd:end -->\n\n## outage\n"
	got, err := replaceSection(doc, "herd", "new")
	require.NoError(t, err)
	require.Equal(t, "# B\n\n## herd\n\nprose\n\n<!-- herd:begin -->\nnew\n<!-- herd:end -->\n\n## outage\n", got, "the prose around is kept")
	again, err := replaceSection(got, "herd", "new\n")
	require.NoError(t, err)
	require.Equal(t, got, again, "idempotent")
	got, err = replaceSection("# B\n", "rate", "table")
	require.NoError(t, err)
	require.Equal(t, "# B\n\n## rate\n\n<!-- rate:begin -->\ntable\n<!-- rate:end -->\n", got, "a missing section is appended")
	_, err = replaceSection("<!-- herd:end -->\n<!-- herd:begin -->\n", "herd", "x")
	require.ErrorIs(t, err, errNoEndMarker)
}

func TestWriteSection(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "docs", "benchmarks.md")
	require.NoError(t, writeSection(path, "herd", "one"))
	require.NoError(t, writeSection(path, "outage", "two"))
	require.NoError(t, writeSection(path, "herd", "three"))
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	require.Equal(t, newDocument+"\n## herd\n\n<!-- herd:begin -->\nthree\n<!-- herd:end -->\n\n## outage\n\n<!-- outage:begin -->\ntwo\n<!-- outage:end -->\n",
		string(data))
	entries, err := os.ReadDir(filepath.Dir(path))
	require.NoError(t, err)
	require.Len(t, entries, 1, "no temporary file left behind")
}

func TestFormat(t *testing.T) {
	t.Parallel()
	ds := make([]time.Duration, 0, 100)
	for i := 100; i >= 1; i-- { // unsorted input
		ds = append(ds, ms(i))
	}
	require.Equal(t, []time.Duration{ms(50), ms(95), ms(100), ms(1)}, []time.Duration{percentile(ds, 50), percentile(ds, 95), percentile(ds, 100), percentile(ds, 0.1)})
	require.Equal(t, ms(100), ds[0], "the input is not sorted in place")
	require.Zero(t, percentile(nil, 50))
	require.Equal(t, 8*time.Second, floorOf(100, 20, 10))
	require.Zero(t, floorOf(20, 20, 10), "the bucket holds them all")
	for n, want := range map[int]string{0: "0", 999: "999", 1000: "1,000", 100000: "100,000", -8000: "-8,000"} {
		require.Equal(t, want, thousands(n))
	}
	require.Equal(t, []string{"4.2 ms", "153 ms", "12.31 s"}, []string{msText(4200 * time.Microsecond), msText(ms(153)), msText(ms(12310))})
	require.Equal(t, 850.0, median([]float64{1000, 700}))
	require.Equal(t, 2.0, median([]float64{3, 1, 2}))
	require.Zero(t, median(nil))
}

// Every scenario has its section in docs/benchmarks.md, so that -write replaces it in place,
// and the top-level headings other documents link to are there.
func TestBenchmarksDoc(t *testing.T) {
	t.Parallel()
	raw, err := os.ReadFile(filepath.Join(repoRoot, "docs", "benchmarks.md"))
	require.NoError(t, err)
	doc := string(raw)
	for _, e := range scenarios() {
		begin, end := markers(e.name)
		i, j := strings.Index(doc, begin), strings.Index(doc, end)
		require.True(t, i >= 0 && j > i, "the section of %s", e.name)
		require.Equal(t, 1, strings.Count(doc, begin), e.name)
		require.Contains(t, doc[i:j], "`go run . "+e.name+" ", "the section says how it was made")
	}
	for _, h := range []string{"herd", "outage", "chaos", "throughput", "tokens"} {
		require.Contains(t, doc, "\n## "+h+"\n")
	}
}
