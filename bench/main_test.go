package main

import (
	"bytes"
	"context"
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func TestRun(t *testing.T) {
	t.Parallel()
	t.Run("NoScenario", func(t *testing.T) {
		t.Parallel()
		var out, errOut bytes.Buffer
		require.ErrorContains(t, run(context.Background(), nil, &out, &errOut), "no scenario")
		require.Contains(t, errOut.String(), "herd")
	})
	t.Run("UnknownScenario", func(t *testing.T) {
		t.Parallel()
		var out, errOut bytes.Buffer
		require.ErrorContains(t, run(context.Background(), []string{"stampede"}, &out, &errOut), `unknown scenario "stampede"`)
	})
	t.Run("HerdBadFlag", func(t *testing.T) {
		t.Parallel()
		var out, errOut bytes.Buffer
		require.ErrorContains(t, run(context.Background(), []string{"herd", "-n", "0"}, &out, &errOut), "-n: must be at least 1")
		require.Empty(t, out.String())
	})
	t.Run("HerdUnknownRow", func(t *testing.T) {
		t.Parallel()
		var out, errOut bytes.Buffer
		err := run(context.Background(), []string{"herd", "-only", "no-retry,bogus"}, &out, &errOut)
		require.ErrorContains(t, err, `unknown row "bogus"`)
		require.ErrorContains(t, err, "llmq-learned")
	})
}

func TestSelectRows(t *testing.T) {
	t.Parallel()
	rows := herdRows(herdOpts{n: 100})
	t.Run("AllByDefault", func(t *testing.T) {
		t.Parallel()
		got, err := selectRows(rows, "")
		require.NoError(t, err)
		require.Len(t, got, len(rows))
	})
	t.Run("SubsetInTableOrder", func(t *testing.T) {
		t.Parallel()
		got, err := selectRows(rows, "llmq-learned, no-retry")
		require.NoError(t, err)
		require.Equal(t, []string{"no-retry", "llmq-learned"}, rowIDs(got))
	})
}

func TestParseHerdFlags_Defaults(t *testing.T) {
	t.Parallel()
	var errOut bytes.Buffer
	o, err := parseHerdFlags(nil, &errOut)
	require.NoError(t, err)
	require.Equal(t, 100, o.n)
	require.InDelta(t, 20.0, o.capacity, 0)
	require.InDelta(t, 10.0, o.rate, 0)
	require.Equal(t, 4, o.workers)
	require.Equal(t, "../bin", o.bin)
	require.Empty(t, o.write)
	require.Equal(t, "3m0s", o.timeout.String())
	require.Equal(t, "8.00 s", seconds(floorOf(o.n, o.capacity, o.rate)))
}

func TestChildEnv(t *testing.T) {
	t.Parallel()
	got := childEnv([]string{"PATH=/bin", "LLMQ_DATABASE_URL=postgres://elsewhere", "LLMQ_CONFIG=x.yaml", "LLMQ_REDIS_URL=redis://x", "HOME=/root"},
		[]string{"LLMQ_BENCH_SIM_KEY=sk"})
	require.Equal(t, []string{"PATH=/bin", "HOME=/root", "LLMQ_BENCH_SIM_KEY=sk"}, got)
}
