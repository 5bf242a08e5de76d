package dispatch

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
)

// TestMetrics_SeriesLookedUpOnce: a hand-over or an idle wait counts into the series NewMetrics
// made, not a lookup of the vector per job: a series taken out of its vector behind the metrics'
// back is not made again (no vector of dispatch's is ever pruned; this only shows where the
// series come from). A label value NewMetrics did not make is looked up.
func TestMetrics_SeriesLookedUpOnce(t *testing.T) {
	m := NewMetrics(prometheus.NewRegistry())
	require.True(t, m.handoffs.DeleteLabelValues(handoffTaken))
	require.True(t, m.idleWaits.DeleteLabelValues(waitEndedByPoll))
	m.handoff(handoffTaken)
	m.idleWaitEnded(waitEndedByPoll)
	require.False(t, m.handoffs.DeleteLabelValues(handoffTaken), "a hand-over looked its series up")
	require.False(t, m.idleWaits.DeleteLabelValues(waitEndedByPoll), "an idle wait looked its series up")

	m.handoff("elsewhere")
	require.True(t, m.handoffs.DeleteLabelValues("elsewhere"))
}
