package main

import (
	"bufio"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestDumpTotal proves that a callgrind dump's total is read from its totals line, else its
// summary line, and that a dump with neither is an error.
func TestDumpTotal(t *testing.T) {
	read := func(s string) (uint64, error) { return dumpTotal(bufio.NewScanner(strings.NewReader(s))) }
	n, err := read("version: 1\nevents: Ir\nsummary: 456\nfn=(1) main\n3 4\ntotals: 456049556\n")
	require.NoError(t, err)
	require.Equal(t, uint64(456049556), n)
	n, err = read("events: Ir\nsummary: 789\n")
	require.NoError(t, err)
	require.Equal(t, uint64(789), n)
	_, err = read("events: Ir\n")
	require.Error(t, err)
}

// TestLatestDumpTotal proves that the newest dump of the process is read (dumps count up:
// cg.<pid>.<n>), not another process's nor the file written at exit.
func TestLatestDumpTotal(t *testing.T) {
	dir := t.TempDir()
	for name, total := range map[string]string{"cg.42": "1", "cg.42.1": "10", "cg.42.2": "20", "cg.42.10": "100", "cg.7.11": "7"} {
		require.NoError(t, os.WriteFile(filepath.Join(dir, name), []byte("totals: "+total+"\n"), 0o600))
	}
	n, err := latestDumpTotal(dir, 42)
	require.NoError(t, err)
	require.Equal(t, uint64(100), n, "dump 10 is newer than dump 2")
	_, err = latestDumpTotal(dir, 43)
	require.Error(t, err)
}

// TestInstrRoundPerJob proves that a job's instructions are the busy window's less the idle
// rate over the busy window's length.
func TestInstrRoundPerJob(t *testing.T) {
	r := instrRound{idle: instrWindow{instr: 50_000_000, secs: 5}, busy: instrWindow{instr: 340_000_000, secs: 10}}
	require.InDelta(t, 1_200_000, r.perJob(200), 0.001, "(340 M − 10 M/s × 10 s) / 200")
}

// TestInstructionsReport proves that the table shows each round, the median and the ratio to the
// floor, that a system of several processes is their sum with each process below it, and that a
// system that could not be measured is named as failed.
func TestInstructionsReport(t *testing.T) {
	idle := instrWindow{instr: 10_000_000, secs: 1}
	round := func(busy uint64) instrRound { return instrRound{idle: idle, busy: instrWindow{instr: busy, secs: 2}} }
	one := func(rounds ...instrRound) []instrProc { return []instrProc{{name: "p", rounds: rounds}} }
	b := &instructionsBench{s: &shared{n: 100}, rows: []instrRow{
		{name: "llmq", procs: one(round(140_000_000), round(120_000_000))},
		{name: "split", procs: []instrProc{
			{name: "api", rounds: []instrRound{round(60_000_000), round(60_000_000)}},
			{name: "worker", rounds: []instrRound{round(100_000_000), round(80_000_000)}},
		}},
		{name: httpFloorRow, procs: one(round(60_000_000), round(60_000_000))},
	}}
	rep := b.report()
	require.Empty(t, rep.failed)
	rows := rep.tables[0].rows
	require.Equal(t, []string{"llmq", "100", "1.20 M, 1.00 M", "1.10 M", "10.00 M /s", "2.75"}, rows[0], "a lone process is its system")
	require.Equal(t, []string{"split", "100", "1.20 M, 1.00 M", "1.10 M", "20.00 M /s", "2.75"}, rows[1], "the processes' sum")
	require.Equal(t, []string{"· api", "100", "0.40 M, 0.40 M", "0.40 M", "10.00 M /s", ""}, rows[2])
	require.Equal(t, []string{"· worker", "100", "0.80 M, 0.60 M", "0.70 M", "10.00 M /s", ""}, rows[3])
	require.Equal(t, []string{httpFloorRow, "100", "0.40 M, 0.40 M", "0.40 M", "10.00 M /s", "1.00"}, rows[4])

	b.rows[2] = instrRow{name: httpFloorRow, err: io.ErrUnexpectedEOF}
	rep = b.report()
	require.Equal(t, []string{httpFloorRow}, rep.failed)
	require.Equal(t, "", rep.tables[0].rows[0][5], "no ratio without the floor")
	require.Equal(t, "not measured: unexpected EOF", rep.tables[0].rows[4][2])
}

// TestFloorProcArgs proves that the floor process's command line parses back to its config, and
// that a missing required flag is refused.
func TestFloorProcArgs(t *testing.T) {
	cfg := floorProcConfig{dbURL: "postgres://x/db", redisURL: "redis://r:6379/0", queue: "q", simURL: "http://sim",
		listen: "127.0.0.1:1", conns: 8, concurrency: 50}
	args := cfg.args()
	require.Equal(t, httpFloorCmd, args[0])
	got, err := parseFloorProc(args[1:], io.Discard)
	require.NoError(t, err)
	require.Equal(t, cfg, got)
	_, err = parseFloorProc([]string{"-database-url", "postgres://x/db"}, io.Discard)
	require.ErrorContains(t, err, "-redis-url is required")
}

// TestInstructionsOnly: -only picks systems by id, in the table's order; an unknown id is refused.
func TestInstructionsOnly(t *testing.T) {
	_, s := parse[*instructionsBench](t, "instructions", "-only", "httpfloor,serve")
	ids, err := selectIDs(instrIDs, s.only)
	require.NoError(t, err)
	require.Equal(t, []string{"serve", "httpfloor"}, ids)
	_, err = selectIDs(instrIDs, "river")
	require.ErrorContains(t, err, `-only: unknown row "river" (rows: serve, llmq, httpfloor)`)
}
