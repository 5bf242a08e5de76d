package main

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/llmsim"
)

func ms(n int) time.Duration { return time.Duration(n) * time.Millisecond }

func TestPercentile(t *testing.T) {
	t.Parallel()
	t.Run("Empty", func(t *testing.T) {
		t.Parallel()
		require.Equal(t, time.Duration(0), percentile(nil, 50))
	})
	t.Run("NearestRank", func(t *testing.T) {
		t.Parallel()
		ds := make([]time.Duration, 0, 100)
		for i := 100; i >= 1; i-- { // unsorted input
			ds = append(ds, ms(i))
		}
		require.Equal(t, ms(50), percentile(ds, 50))
		require.Equal(t, ms(95), percentile(ds, 95))
		require.Equal(t, ms(100), percentile(ds, 100))
		require.Equal(t, ms(1), percentile(ds, 0.1))
		require.Equal(t, ms(100), ds[0], "the input is not sorted in place")
	})
	t.Run("Small", func(t *testing.T) {
		t.Parallel()
		ds := []time.Duration{ms(30), ms(10), ms(20)}
		require.Equal(t, ms(20), percentile(ds, 50))
		require.Equal(t, ms(30), percentile(ds, 95))
	})
}

func TestFloorOf(t *testing.T) {
	t.Parallel()
	require.Equal(t, 8*time.Second, floorOf(100, 20, 10))
	require.Equal(t, 19*time.Second+600*time.Millisecond, floorOf(1000, 20, 50))
	require.Equal(t, time.Duration(0), floorOf(20, 20, 10), "the bucket holds them all")
}

func stats(requests, tooMany int) llmsim.Stats {
	return llmsim.Stats{Requests: requests, ByStatus: map[int]int{200: requests - tooMany, 429: tooMany}}
}

func TestSummarize(t *testing.T) {
	t.Parallel()
	t.Run("Complete", func(t *testing.T) {
		t.Parallel()
		outs := []outcome{
			{done: true, ok: true, latency: ms(100), at: ms(110)},
			{done: true, ok: false, latency: ms(900), at: ms(950)},
			{done: true, ok: true, latency: ms(300), at: ms(320)},
		}
		r := summarize("x", outs, stats(7, 4), time.Minute)
		require.Equal(t, 3, r.n)
		require.Equal(t, 2, r.succeeded)
		require.Equal(t, 7, r.requests)
		require.Equal(t, 4, r.tooMany)
		require.Equal(t, ms(100), r.p50)
		require.Equal(t, ms(300), r.p95)
		require.True(t, r.complete)
		require.Equal(t, ms(950), r.last, "the last outcome counts, failures included")
	})
	t.Run("TimedOut", func(t *testing.T) {
		t.Parallel()
		outs := []outcome{{done: true, ok: true, latency: ms(100), at: ms(100)}, {}}
		r := summarize("x", outs, stats(5, 4), time.Minute)
		require.False(t, r.complete)
		require.Equal(t, time.Minute, r.last)
		require.Equal(t, "> 60.00 s", lastText(r))
	})
}

func TestTarget_Misses(t *testing.T) {
	t.Parallel()
	floor := 8 * time.Second
	good := result{n: 100, succeeded: 100, requests: 100, complete: true, last: ms(8300)}
	t.Run("ConfiguredMet", func(t *testing.T) {
		t.Parallel()
		require.Empty(t, herdConfiguredTarget.misses(good, floor))
	})
	t.Run("ConfiguredMissedEverywhere", func(t *testing.T) {
		t.Parallel()
		r := good
		r.succeeded, r.requests, r.tooMany, r.last = 97, 130, 30, ms(8500)
		require.Equal(t, []string{"97/100 succeeded", "last result 8.50 s > 8.40 s", "130 provider requests ≠ 100", "30 429s > 0"},
			herdConfiguredTarget.misses(r, floor))
	})
	t.Run("LearnedAllowsTenPercentMore", func(t *testing.T) {
		t.Parallel()
		r := good
		r.requests, r.tooMany, r.last = 110, 10, ms(9200)
		require.Empty(t, herdLearnedTarget.misses(r, floor))
		r.requests = 111
		require.Equal(t, []string{"111 provider requests > 110"}, herdLearnedTarget.misses(r, floor))
	})
	t.Run("TimedOut", func(t *testing.T) {
		t.Parallel()
		r := good
		r.complete, r.last = false, time.Minute
		require.Equal(t, []string{"last result > 60.00 s > 8.40 s"}, herdConfiguredTarget.misses(r, floor))
	})
	t.Run("RowError", func(t *testing.T) {
		t.Parallel()
		r := result{n: 100, err: errors.New("worker-1 exited early\nlog tail")}
		require.Equal(t, []string{"the row failed: worker-1 exited early"}, herdConfiguredTarget.misses(r, floor))
		r.target = &herdConfiguredTarget
		require.Equal(t, "FAIL", verdict(r, floor))
	})
	t.Run("Describe", func(t *testing.T) {
		t.Parallel()
		require.Equal(t, "100/100 succeeded, last result ≤ 1.05 × floor (8.40 s), exactly 100 provider requests, 0 429s",
			herdConfiguredTarget.describe(100, floor))
		require.Equal(t, "100/100 succeeded, last result ≤ 1.15 × floor (9.20 s), ≤ 110 provider requests",
			herdLearnedTarget.describe(100, floor))
	})
}

func TestCells(t *testing.T) {
	t.Parallel()
	floor := 8 * time.Second
	r := result{name: "llmq (limit configured)", n: 100, succeeded: 100, requests: 100, p50: ms(4040), p95: ms(7640),
		last: ms(8040), complete: true, target: &herdConfiguredTarget}
	require.Equal(t, []string{"llmq (limit configured)", "100/100", "100", "0", "1.00", "4.04 s", "7.64 s", "8.04 s", "1.00", "PASS"},
		cells(r, floor))
	none := result{name: "no retry", n: 100, requests: 100, tooMany: 100, complete: true}
	require.Equal(t, []string{"no retry", "0/100", "100", "100", "n/a", "n/a", "n/a", "0.00 s", "0.00", ""}, cells(none, floor))
	timedOut := result{name: "asynq", n: 100, succeeded: 90, requests: 300, tooMany: 210, last: 3 * time.Minute}
	require.Equal(t, "> 180.00 s", cells(timedOut, floor)[7])
	require.Equal(t, "> 22.50", cells(timedOut, floor)[8])
}

func TestTextTable(t *testing.T) {
	t.Parallel()
	got := textTable([]string{"strategy", "n", "× floor"}, [][]string{{"no retry", "20/100", "0.00"}, {"llmq", "100/100", "1.01"}})
	want := "" +
		"strategy        n  × floor\n" +
		"--------  -------  -------\n" +
		"no retry   20/100     0.00\n" +
		"llmq      100/100     1.01\n"
	require.Equal(t, want, got)
}

func TestMarkdownTable(t *testing.T) {
	t.Parallel()
	got := markdownTable([]string{"strategy", "n"}, [][]string{{"a|b", "1"}})
	require.Equal(t, "| strategy | n |\n|---|---:|\n| a\\|b | 1 |\n", got)
}

func TestReplaceSection(t *testing.T) {
	t.Parallel()
	const b, e = "<!-- herd:begin -->", "<!-- herd:end -->"
	t.Run("Replaces", func(t *testing.T) {
		t.Parallel()
		doc := "# T\n\nintro\n\n" + b + "\nold\ntable\n" + e + "\n\n## other\nkept\n"
		got, err := replaceSection(doc, b, e, "new")
		require.NoError(t, err)
		require.Equal(t, "# T\n\nintro\n\n"+b+"\nnew\n"+e+"\n\n## other\nkept\n", got)
	})
	t.Run("Idempotent", func(t *testing.T) {
		t.Parallel()
		once, err := replaceSection("# T\n", b, e, "body\n")
		require.NoError(t, err)
		twice, err := replaceSection(once, b, e, "body\n")
		require.NoError(t, err)
		require.Equal(t, once, twice)
	})
	t.Run("AppendsWhenMissing", func(t *testing.T) {
		t.Parallel()
		got, err := replaceSection("# T\nintro", b, e, "body\n")
		require.NoError(t, err)
		require.Equal(t, "# T\nintro\n\n"+b+"\nbody\n"+e+"\n", got)
	})
	t.Run("EmptyDoc", func(t *testing.T) {
		t.Parallel()
		got, err := replaceSection("", b, e, "body")
		require.NoError(t, err)
		require.Equal(t, b+"\nbody\n"+e+"\n", got)
	})
	t.Run("EndMarkerMissing", func(t *testing.T) {
		t.Parallel()
		_, err := replaceSection("x\n"+b+"\nbody\n", b, e, "new")
		require.ErrorIs(t, err, errNoEndMarker)
	})
	t.Run("EndMarkerOnlyBeforeBegin", func(t *testing.T) {
		t.Parallel()
		_, err := replaceSection(e+"\n"+b+"\n", b, e, "new")
		require.ErrorIs(t, err, errNoEndMarker)
	})
}

func TestWriteSection(t *testing.T) {
	t.Parallel()
	t.Run("CreatesWithIntro", func(t *testing.T) {
		t.Parallel()
		path := filepath.Join(t.TempDir(), "docs", "benchmarks.md")
		require.NoError(t, writeSection(path, herdBegin, herdEnd, "table one"))
		data, err := os.ReadFile(path)
		require.NoError(t, err)
		require.True(t, strings.HasPrefix(string(data), "# Benchmarks\n"))
		require.Contains(t, string(data), herdBegin+"\ntable one\n"+herdEnd+"\n")
	})
	t.Run("ReplacesAndKeepsTheRest", func(t *testing.T) {
		t.Parallel()
		path := filepath.Join(t.TempDir(), "benchmarks.md")
		require.NoError(t, os.WriteFile(path, []byte("# Mine\n\n"+herdBegin+"\nold\n"+herdEnd+"\n\n## later\n"), 0o644))
		require.NoError(t, writeSection(path, herdBegin, herdEnd, "new"))
		data, err := os.ReadFile(path)
		require.NoError(t, err)
		require.Equal(t, "# Mine\n\n"+herdBegin+"\nnew\n"+herdEnd+"\n\n## later\n", string(data))
		entries, err := os.ReadDir(filepath.Dir(path))
		require.NoError(t, err)
		require.Len(t, entries, 1, "no temporary file left behind")
	})
}

func TestReport(t *testing.T) {
	t.Parallel()
	o := herdOpts{n: 100, capacity: 20, rate: 10, timeout: 3 * time.Minute}
	rep := report{
		opts: o, floor: 8 * time.Second, command: "go run . herd -write docs/benchmarks.md",
		date: time.Date(2026, 5, 1, 0, 0, 0, 0, time.UTC), machine: "linux/amd64, nproc 2",
		results: []result{
			{name: "no retry", n: 100, succeeded: 20, requests: 100, tooMany: 80, complete: true, last: ms(5)},
			{name: "llmq (limit configured)", n: 100, succeeded: 100, requests: 157, tooMany: 57, complete: true,
				last: ms(9000), p50: ms(4000), p95: ms(8000), target: &herdConfiguredTarget},
		},
	}
	md := rep.markdown()
	require.Contains(t, md, "`go run . herd -write docs/benchmarks.md` — 2026-05-01, linux/amd64, nproc 2.")
	require.Contains(t, md, "| llmq (limit configured) | 100/100 | 157 | 57 | 1.57 | 4.00 s | 8.00 s | 9.00 s | 1.12 | FAIL |")
	require.Contains(t, md, "floor = (100 − 20) / 10 = 8.00 s")
	require.Contains(t, md, "llmq (limit configured) misses its target: last result 9.00 s > 8.40 s; 157 provider requests ≠ 100; 57 429s > 0.")
	txt := rep.text()
	require.Contains(t, txt, "Target, llmq (limit learned): 100/100 succeeded, last result ≤ 1.15 × floor (9.20 s), ≤ 110 provider requests.")
	require.Regexp(t, `(?m)^no retry +20/100 +100 +80 +5\.00 +0\.00 s`, txt)
}
