package main

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/llmq/llmq/internal/config"
	"github.com/llmq/llmq/internal/llmsim"
)

// herd is `bench herd`: n jobs fired at once against a token bucket, at plain retrying
// clients, plain asynq and llmq (limit configured, limit learned).
type herd struct {
	s       *shared
	results []result
}

// herdRows are the rows of the herd table. The herd targets judge the llmq rows: with the
// provider's limit configured, the floor within 5 %, one request per job and no 429; with the
// limit learned from the provider's headers, the floor within 15 % and at most 1.1 requests per
// success.
func (h *herd) rows() []burstRow {
	plain := func(s strategy) func(context.Context, *rowEnv) ([]outcome, error) {
		return func(ctx context.Context, e *rowEnv) ([]outcome, error) { return runStrategy(ctx, e, s), nil }
	}
	limits := &config.Limits{RequestsPerSecond: h.s.rate, Burst: int(h.s.capacity)}
	return []burstRow{
		{id: "no-retry", name: "no retry", run: plain(strategy{attempts: 1})},
		{id: "backoff3", name: "500ms·2^n·U(0.9,1.1), 3 attempts", run: plain(strategy{attempts: 3, delay: tenPercentJitter(backoffBase)})},
		{id: "backoff8", name: "500ms·2^n·U(0.9,1.1), 8 attempts", run: plain(strategy{attempts: 8, delay: tenPercentJitter(backoffBase)})},
		{id: "full-jitter8", name: "full jitter, 8 attempts", run: plain(strategy{attempts: 8, delay: fullJitter(backoffBase, backoffCap)})},
		{id: "retry-after8", name: "Retry-After + full jitter, 8 attempts", run: plain(strategy{attempts: 8, delay: retryAfterJitter(backoffBase, backoffCap)})},
		{id: "asynq", name: "asynq, default retry", run: runAsynq},
		{id: "llmq-configured", name: "llmq (limit configured)", target: &target{maxRatio: 1.05, exactRequests: true, no429: true},
			run: llmqRow(llmqSetup{limits: limits})},
		{id: "llmq-learned", name: "llmq (limit learned)", target: &target{maxRatio: 1.15, maxPerSuccess: 1.1},
			run: llmqRow(llmqSetup{})},
	}
}

func (h *herd) flags(fs *flagSet, s *shared) {
	h.s = s
	s.base(fs, 4)
	s.redis(fs)
	s.jobs(fs, 100, "jobs fired at once")
	s.bucket(fs, 20, 10)
	s.deadline(fs, 3*time.Minute, "cap on each row, from its first submit")
	s.seeded(fs)
	s.rows(fs, rowIDs(h.rows()))
}

func (h *herd) run(ctx context.Context, log logf) error {
	rows, err := selectRows(h.rows(), h.s.only)
	if err != nil {
		return err
	}
	for _, r := range rows {
		if strings.HasPrefix(r.id, "llmq") {
			if err := h.s.binaries(ctx, log); err != nil {
				return err
			}
			break
		}
	}
	log("%d jobs at once against a bucket of %g refilling %g/s (floor %s), %d rows", h.s.n, h.s.capacity, h.s.rate,
		seconds(h.s.floor()), len(rows))
	b := burst{shared: h.s, sim: llmsim.Config{Capacity: h.s.capacity, RefillPerSecond: h.s.rate}}
	h.results = b.runRows(ctx, log, rows)
	return nil
}

func (h *herd) report() report {
	s, floor := h.s, h.s.floor()
	j := targetJudge(floor)
	rows := make([][]string, len(h.results))
	for i, r := range h.results {
		rows[i] = burstCells(r, floor, j)
	}
	notes := []string{fmt.Sprintf("%d jobs at once; bucket of %g refilling %g/s; floor = %s; %d llmq workers.",
		s.n, s.capacity, s.rate, s.floorText(), s.workers)}
	judged, failed := burstNotes(h.results, j)
	return report{tables: []table{{burstHeader, rows}}, notes: append(notes, judged...), failed: failed}
}
