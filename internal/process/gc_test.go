package process

import (
	"runtime/debug"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestTuneGC: without GOGC the collector's target becomes DefaultGCPercent; with GOGC set, the
// target Go applied from it stays. Not parallel: the target is the process's.
func TestTuneGC(t *testing.T) {
	prev := debug.SetGCPercent(100)
	t.Cleanup(func() { debug.SetGCPercent(prev) })

	require.Equal(t, DefaultGCPercent, TuneGC(func(string) string { return "" }))
	require.Equal(t, DefaultGCPercent, debug.SetGCPercent(DefaultGCPercent), "the target in force")

	debug.SetGCPercent(150) // as Go applies GOGC=150 at start
	gogc := func(k string) string {
		if k == "GOGC" {
			return "150"
		}
		return ""
	}
	require.Equal(t, 150, TuneGC(gogc))
	require.Equal(t, 150, debug.SetGCPercent(150), "the operator's target stays")
}
