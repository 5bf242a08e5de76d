package api

import (
	"time"

	"github.com/llmq/llmq/internal/deltastream"
	"github.com/llmq/llmq/internal/jobs"
)

// The submit body's lanes: "auto" resolves to online or batch at submit.
const (
	laneOnline = "online"
	laneBatch  = "batch"
	laneAuto   = "auto"
)

// parseLane resolves the body's "lane" into p.Lane: online (also when absent), batch (refused
// with 400 when the credential has no batch lane), or auto: batch when the credential allows
// batches and the job's timeout is at least the credential's batch window, online otherwise.
// windows holds the credentials whose batch lane is enabled, with their window. It runs after
// the job's limits are read (auto compares the timeout).
func parseLane(lane *string, windows map[string]time.Duration, p *jobs.CreateParams) error {
	if lane == nil {
		p.Lane = jobs.LaneOnline
		return nil
	}
	window, enabled := windows[p.Credential]
	switch *lane {
	case laneOnline:
		p.Lane = jobs.LaneOnline
	case laneBatch:
		if !enabled {
			return invalid("batch_unavailable", "lane \"batch\": credential %q has no batch lane (its batch.enabled is false)", p.Credential)
		}
		if deltastream.Requested(p.Request) {
			return invalid("stream_in_batch", "lane \"batch\": a streaming request (\"stream\": true) cannot go through a batch API; send it online")
		}
		p.Lane = jobs.LaneBatch
	case laneAuto:
		// A streaming request wants its answer as it is written: online, whatever its timeout.
		p.Lane = jobs.LaneOnline
		if enabled && p.Timeout >= window && !deltastream.Requested(p.Request) {
			p.Lane = jobs.LaneBatch
		}
	default:
		return invalid("invalid_lane", "lane %q must be \"online\", \"batch\" or \"auto\"", truncateValue(*lane))
	}
	return nil
}

// batchTimeout gives a "batch" job without a timeout of its own its credential's window as its
// timeout: the default (10m) would send it online at once (its deadline inside the online
// fallback). It runs before the job's limits are read, which compare the per-call timeouts
// with the job's.
func batchTimeout(lane, timeout *string, windows map[string]time.Duration, p *jobs.CreateParams) {
	if window, ok := windows[p.Credential]; ok && lane != nil && *lane == laneBatch && timeout == nil {
		p.Timeout = window
	}
}
