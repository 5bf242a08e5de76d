package main

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// shared holds the flags the scenarios have in common. Each scenario registers the ones it
// takes, with its own defaults; the others keep their zero values.
type shared struct {
	n        int           // -n: jobs
	timeout  time.Duration // -timeout: cap on a row's (or run's) wait for its jobs
	runs     int           // -runs: runs per row; the median run is shown
	seed     uint64        // -seed: of every random draw
	only     string        // -only: comma-separated rows to run
	workers  int           // -workers: llmq worker processes
	capacity float64       // -capacity: the simulator's request bucket
	rate     float64       // -rate: its refill per second
	write    string        // -write: the Markdown file whose section is rewritten
	build    bool          // -build: rebuild the api and worker binaries
	bin      string        // -bin: where the api and worker binaries are
	dbURL    string        // -database-url: the Postgres server; databases are created there
	redisURL string        // -redis-url: the Redis llmq and asynq use
	keepLogs bool          // -keep-logs: keep the config and process logs
}

// repoRoot is the llmq checkout whose api and worker are measured: the bench runs in bench/.
const repoRoot = ".."

// base registers the flags every scenario takes.
func (s *shared) base(fs *flagSet, workers int) {
	fs.intAtLeast(&s.workers, "workers", workers, 1, "llmq worker processes")
	fs.StringVar(&s.write, "write", "", "Markdown file whose section of this scenario is replaced with the table (empty: don't write)")
	fs.BoolVar(&s.build, "build", false, "build the api and worker binaries into -bin even when present")
	fs.StringVar(&s.bin, "bin", filepath.Join(repoRoot, "bin"), "directory holding the api and worker binaries (built there when missing)")
	fs.StringVar(&s.dbURL, "database-url", "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable",
		"Postgres server (a database llmq_bench_<random> is created there for each run and dropped)")
	fs.BoolVar(&s.keepLogs, "keep-logs", false, "keep the config and process logs (their directory is printed)")
}

// redis registers -redis-url, for the scenarios that use the machine's Redis.
func (s *shared) redis(fs *flagSet) {
	fs.StringVar(&s.redisURL, "redis-url", "redis://127.0.0.1:6379/0", "Redis (unique queues and keys per run; never flushed)")
}

// jobs registers -n.
func (s *shared) jobs(fs *flagSet, n int, usage string) { fs.intAtLeast(&s.n, "n", n, 1, usage) }

// deadline registers -timeout.
func (s *shared) deadline(fs *flagSet, d time.Duration, usage string) {
	fs.positiveDuration(&s.timeout, "timeout", d, usage)
}

// repeat registers -runs.
func (s *shared) repeat(fs *flagSet, runs int) {
	fs.intAtLeast(&s.runs, "runs", runs, 1, "runs of each row, interleaved; the median run is shown")
}

// seeded registers -seed.
func (s *shared) seeded(fs *flagSet) {
	fs.Uint64Var(&s.seed, "seed", 1, "seed of every random draw (clients' jitter, latency, victims)")
}

// rows registers -only over the row ids.
func (s *shared) rows(fs *flagSet, ids []string) {
	fs.StringVar(&s.only, "only", "", "comma-separated rows to run (default all): "+strings.Join(ids, ", "))
}

// bucket registers the simulator's request bucket, which is also the credential's limit
// wherever a row configures one.
func (s *shared) bucket(fs *flagSet, capacity, rate float64) {
	fs.floatAtLeast(&s.capacity, "capacity", capacity, 1, "the simulator's bucket capacity (requests); also the configured burst")
	fs.positiveFloat(&s.rate, "rate", rate, "the simulator's refill rate (requests per second); also the configured limit")
}

// floor is the least time n requests take against a full bucket: capacity at once, the rest
// at the refill rate. Zero when the bucket holds them all.
func (s *shared) floor() time.Duration { return floorOf(s.n, s.capacity, s.rate) }

// floorText renders the floor's formula: "(100 − 20) / 10 = 8.00 s".
func (s *shared) floorText() string {
	if s.floor() == 0 {
		return "0 s (the bucket holds every job)"
	}
	return fmt.Sprintf("(%d − %g) / %g = %s", s.n, s.capacity, s.rate, seconds(s.floor()))
}

// binaries builds the api and worker when they are missing or -build is set.
func (s *shared) binaries(ctx context.Context, log logf) error {
	return ensureBinaries(ctx, s.bin, s.build, log)
}

// binariesFor builds the binaries when one of the throughput systems ids runs them (an llmq
// layout); see binaries.
func (s *shared) binariesFor(ctx context.Context, ids []string, log logf) error {
	if !slices.Contains(ids, tpLLMQ) && !slices.Contains(ids, tpServe) {
		return nil
	}
	return s.binaries(ctx, log)
}

// selectIDs keeps the ids named in only (comma-separated), in the order of ids; empty keeps
// all.
func selectIDs(ids []string, only string) ([]string, error) {
	if strings.TrimSpace(only) == "" {
		return ids, nil
	}
	want := map[string]bool{}
	for id := range strings.SplitSeq(only, ",") {
		id = strings.TrimSpace(id)
		if !slices.Contains(ids, id) {
			return nil, fmt.Errorf("-only: unknown row %q (rows: %s)", id, strings.Join(ids, ", "))
		}
		want[id] = true
	}
	var out []string
	for _, id := range ids {
		if want[id] {
			out = append(out, id)
		}
	}
	return out, nil
}
