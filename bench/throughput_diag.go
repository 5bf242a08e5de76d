package main

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
)

// The profile mode's off-CPU diagnostics: a CPU profile shows where a process computes, not
// where a job waits. These show the waits: the pgx pools' acquire queues, what the database's
// backends are doing (pg_stat_activity sampled), and the Redis commands per job.

// poolUse is what a pgx pool did between two Stat calls.
type poolUse struct {
	name       string
	maxConns   int32
	acquires   int64
	emptyWaits int64         // acquires that found no idle connection and waited
	waited     time.Duration // total time spent acquiring
}

// poolDelta returns the use of a pool between stats a and b.
func poolDelta(name string, a, b *pgxpool.Stat) poolUse {
	return poolUse{name: name, maxConns: b.MaxConns(), acquires: b.AcquireCount() - a.AcquireCount(),
		emptyWaits: b.EmptyAcquireCount() - a.EmptyAcquireCount(), waited: b.AcquireDuration() - a.AcquireDuration()}
}

// text renders the use per job: "api pool (max 4 conns): 5.0 acquires/job, 83% waited, mean acquire 12.3 ms".
func (u poolUse) text(jobs int) string {
	if u.acquires == 0 || jobs == 0 {
		return fmt.Sprintf("%s pool (max %d conns): no acquires", u.name, u.maxConns)
	}
	return fmt.Sprintf("%s pool (max %d conns): %.1f acquires per job, %.0f%% of them waited for a connection, mean acquire %s",
		u.name, u.maxConns, float64(u.acquires)/float64(jobs), 100*float64(u.emptyWaits)/float64(u.acquires),
		msText(u.waited/time.Duration(u.acquires)))
}

// waitSampler samples the state and wait event of the backends of one database.
type waitSampler struct {
	mu      sync.Mutex
	counts  map[string]int
	samples int
	stop    func()
}

// backendState is how a sampled backend is labelled: "active (on CPU)", "active, IO:WALSync",
// "idle in transaction (waiting for the client)".
func backendState(state, waitType, waitEvent string) string {
	switch {
	case state == "active" && waitType == "":
		return "active, running"
	case state == "active":
		return "active, waiting on " + waitType + ":" + waitEvent
	case state == "idle in transaction":
		return "idle in transaction (waiting for the client's next statement)"
	}
	return state
}

// startWaitSampler samples every interval the backends connected to db (except the observers)
// until the returned sampler is stopped.
func startWaitSampler(ctx context.Context, adminURL, db string, interval time.Duration) (*waitSampler, error) {
	cfg, err := pgx.ParseConfig(adminURL)
	if err != nil {
		return nil, fmt.Errorf("parse database url: %w", err)
	}
	cfg.RuntimeParams["application_name"] = observerApp
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("connect wait sampler: %w", err)
	}
	ws := &waitSampler{counts: map[string]int{}}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	ws.stop = func() { cancel(); <-done }
	go func() {
		defer close(done)
		defer conn.Close(context.WithoutCancel(ctx))
		tick := time.NewTicker(interval)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			rows, err := conn.Query(ctx, `SELECT coalesce(state, ''), coalesce(wait_event_type, ''), coalesce(wait_event, '')
FROM pg_stat_activity WHERE datname = $1 AND application_name <> $2 AND backend_type = 'client backend'`, db, observerApp)
			if err != nil {
				continue
			}
			var st, wt, we string
			local := map[string]int{}
			if _, err := pgx.ForEachRow(rows, []any{&st, &wt, &we}, func() error {
				local[backendState(st, wt, we)]++
				return nil
			}); err != nil {
				continue
			}
			ws.mu.Lock()
			for k, v := range local {
				ws.counts[k] += v
			}
			ws.samples++
			ws.mu.Unlock()
		}
	}()
	return ws, nil
}

// waitShare is one line of the wait table: a backend state and the mean number of backends in it.
type waitShare struct {
	state string
	mean  float64 // backends in this state, averaged over the samples
}

// result stops the sampler and returns the states by mean backends, most first.
func (ws *waitSampler) result() []waitShare {
	ws.stop()
	ws.mu.Lock()
	defer ws.mu.Unlock()
	return waitShares(ws.counts, ws.samples)
}

// waitShares turns counts over samples into states by mean backends, most first (ties by name).
func waitShares(counts map[string]int, samples int) []waitShare {
	if samples == 0 {
		return nil
	}
	out := make([]waitShare, 0, len(counts))
	for _, k := range slices.Sorted(maps.Keys(counts)) {
		out = append(out, waitShare{state: k, mean: float64(counts[k]) / float64(samples)})
	}
	slices.SortStableFunc(out, func(a, b waitShare) int { return cmp.Compare(b.mean, a.mean) })
	return out
}

// parseCommandStats returns calls per command from the text of Redis's INFO commandstats
// ("cmdstat_evalsha:calls=12,usec=...").
func parseCommandStats(info string) map[string]int64 {
	out := map[string]int64{}
	for line := range strings.SplitSeq(info, "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || !strings.HasPrefix(name, "cmdstat_") {
			continue
		}
		for field := range strings.SplitSeq(rest, ",") {
			if v, ok := strings.CutPrefix(field, "calls="); ok {
				if n, err := strconv.ParseInt(v, 10, 64); err == nil {
					out[strings.TrimPrefix(name, "cmdstat_")] = n
				}
			}
		}
	}
	return out
}

func commandStats(ctx context.Context, rdb redis.UniversalClient) (map[string]int64, error) {
	info, err := rdb.Info(ctx, "commandstats").Result()
	if err != nil {
		return nil, fmt.Errorf("redis info commandstats: %w", err)
	}
	return parseCommandStats(info), nil
}

// commandsPerJob returns the commands whose calls grew between a and b, per job, most first;
// the total first.
func commandsPerJob(a, b map[string]int64, jobs int) string {
	type cmdRate struct {
		name string
		per  float64
	}
	var rates []cmdRate
	var total int64
	for name, v := range b {
		if d := v - a[name]; d > 0 {
			total += d
			rates = append(rates, cmdRate{name, float64(d) / float64(jobs)})
		}
	}
	slices.SortFunc(rates, func(x, y cmdRate) int {
		if c := cmp.Compare(y.per, x.per); c != 0 {
			return c
		}
		return cmp.Compare(x.name, y.name)
	})
	parts := []string{fmt.Sprintf("%.1f commands per job", float64(total)/float64(jobs))}
	for _, r := range rates {
		if r.per >= 0.05 {
			parts = append(parts, fmt.Sprintf("%s %.1f", r.name, r.per))
		}
	}
	return strings.Join(parts, ", ")
}

// subCounts returns a − b per key of a (b's missing keys count 0).
func subCounts(a, b map[string]int64) map[string]int64 {
	out := make(map[string]int64, len(a))
	for k, v := range a {
		out[k] = v - b[k]
	}
	return out
}

// scaleCounts returns every count times f, rounded.
func scaleCounts(a map[string]int64, f float64) map[string]int64 {
	out := make(map[string]int64, len(a))
	for k, v := range a {
		out[k] = int64(float64(v)*f + 0.5)
	}
	return out
}
