package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// profileView is one listing of the profiles: a title and the arguments of `go tool pprof`.
type profileView struct {
	title string
	alloc bool // the allocation profile (else CPU)
	args  []string
}

// profileViews are the listings recorded: the worker's hot path by cumulative CPU (llmq's own
// functions, then everything), the API's, the whole process by flat CPU, and the allocations of
// both paths.
var profileViews = []profileView{
	{title: "Worker hot path (jobs.(*Handler).ProcessTask and below, llmq's functions only), top 15 by cumulative CPU",
		args: []string{"-top", "-cum", "-nodecount=15", `-show_from=jobs\.\(\*Handler\)\.ProcessTask$`, `-show=github\.com/llmq/llmq/`}},
	{title: "Worker hot path (jobs.(*Handler).ProcessTask and below, all functions), top 15 by cumulative CPU",
		args: []string{"-top", "-cum", "-nodecount=15", `-show_from=jobs\.\(\*Handler\)\.ProcessTask$`}},
	{title: "API submit path (api.(*Server).submit and below), top 15 by cumulative CPU",
		args: []string{"-top", "-cum", "-nodecount=15", `-show_from=api\.\(\*Server\)\.submit$`}},
	{title: "Whole process (api, worker, clients, simulator), top 15 by own CPU",
		args: []string{"-top", "-nodecount=15"}},
	{title: "Allocations of the worker and API paths (bytes allocated during the run), top 15 by cumulative",
		alloc: true,
		args: []string{"-top", "-cum", "-nodecount=15", "-sample_index=alloc_space",
			`-focus=jobs\.\(\*Handler\)\.ProcessTask$|api\.\(\*Server\)\.submit$`}},
}

// tpProfileReport is a finished profile-mode run.
type tpProfileReport struct {
	tpHead
	opts  tpOpts
	res   tpResult
	dir   string
	views []string // the listings, in profileViews order
	// The off-CPU diagnostics of the measured jobs.
	pools []poolUse
	waits []waitShare
	redis string // Redis commands per job; "" when not measured
	n     int    // measured jobs
	load  string // how they were offered: "64 clients", "offered at 500/s"
}

// runProfileMode is `-mode profile`: llmq's api and one worker in this process, under the CPU
// profiler for the measured jobs, and allocation snapshots before and after.
func runProfileMode(ctx context.Context, o tpOpts, stderr io.Writer) (tpProfileReport, error) {
	rep := tpProfileReport{opts: o, dir: o.profile}
	if rep.dir == "" {
		d, err := os.MkdirTemp("", "llmq-bench-pprof-")
		if err != nil {
			return rep, fmt.Errorf("create profile dir: %w", err)
		}
		rep.dir = d
	} else if err := os.MkdirAll(rep.dir, 0o755); err != nil {
		return rep, fmt.Errorf("create profile dir: %w", err)
	}
	cpuPath := filepath.Join(rep.dir, "cpu.pprof")
	allocBase, allocPath := filepath.Join(rep.dir, "allocs-before.pprof"), filepath.Join(rep.dir, "allocs.pprof")
	var cpuFile *os.File
	sys := &llmqSystem{o: o, stderr: stderr, inProcess: true}
	var (
		apiStat0, workerStat0 *pgxpool.Stat
		sampler               *waitSampler
		cmds0, cmdsBackground map[string]int64
		cmdsStart             time.Time
	)
	hook := &measureHook{
		start: func() error {
			if err := writeAllocs(allocBase); err != nil {
				return err
			}
			apiStat0, workerStat0 = sys.apiPool.Stat(), sys.workerPool.Stat()
			if sys.rdb != nil {
				// Other clients of a shared Redis: their rate over 2 s (llmq idle) is subtracted.
				a, errA := commandStats(ctx, sys.rdb)
				time.Sleep(redisBackgroundWindow)
				b, errB := commandStats(ctx, sys.rdb)
				if errA == nil && errB == nil {
					cmdsBackground, cmds0, cmdsStart = subCounts(b, a), b, time.Now()
				}
			}
			var err error
			if sampler, err = startWaitSampler(ctx, o.dbURL, sys.dbName, 10*time.Millisecond); err != nil {
				tpLogf(stderr, "  postgres wait sampling off: %v", err)
			}
			f, err := os.Create(cpuPath)
			if err != nil {
				return fmt.Errorf("create cpu profile: %w", err)
			}
			if err := pprof.StartCPUProfile(f); err != nil {
				f.Close()
				return fmt.Errorf("start cpu profile: %w", err)
			}
			cpuFile = f
			return nil
		},
		stop: func() error {
			pprof.StopCPUProfile()
			if sampler != nil {
				rep.waits = sampler.result()
			}
			rep.pools = []poolUse{poolDelta("api", apiStat0, sys.apiPool.Stat()), poolDelta("worker", workerStat0, sys.workerPool.Stat())}
			if cmds0 != nil {
				if cmds1, err := commandStats(ctx, sys.rdb); err == nil {
					scale := float64(time.Since(cmdsStart)) / float64(redisBackgroundWindow)
					rep.redis = commandsPerJob(cmds0, subCounts(cmds1, scaleCounts(cmdsBackground, scale)), rep.n)
				}
			}
			return errors.Join(cpuFile.Close(), writeAllocs(allocPath))
		},
	}
	n, drive, load := o.n, closedLoop(o.clients), fmt.Sprintf("%d clients", o.clients)
	if o.rateSet {
		n = max(1, int(o.rates[0]*o.duration.Seconds()))
		drive, load = openLoop(o.rates[0], &openLoopStats{}), fmt.Sprintf("offered at %g/s", o.rates[0])
	}
	rep.n, rep.load = n, load
	tpLogf(stderr, "llmq in-process (api + one worker) under pprof: %d jobs, %s; profiles in %s", n, load, rep.dir)
	rep.res = measure(ctx, o, sys, tpLLMQ, "llmq in-process (profiled)", n, drive, stderr, hook)
	if rep.res.err != nil {
		return rep, rep.res.err
	}
	for _, v := range profileViews {
		args := append([]string{"tool", "pprof"}, v.args...)
		if v.alloc {
			args = append(args, "-base", allocBase, allocPath)
		} else {
			args = append(args, cpuPath)
		}
		out, err := exec.CommandContext(ctx, "go", args...).CombinedOutput()
		if err != nil {
			return rep, fmt.Errorf("go %s: %w\n%s", strings.Join(args, " "), err, out)
		}
		rep.views = append(rep.views, trimPprofTop(string(out)))
	}
	return rep, nil
}

// redisBackgroundWindow is how long the Redis commands of other clients are counted before the
// measurement, with llmq idle.
const redisBackgroundWindow = 2 * time.Second

// writeAllocs writes the allocation profile to path after a GC (so that it is up to date).
func writeAllocs(path string) error {
	runtime.GC()
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("create alloc profile: %w", err)
	}
	if err := pprof.Lookup("allocs").WriteTo(f, 0); err != nil {
		f.Close()
		return fmt.Errorf("write alloc profile: %w", err)
	}
	return f.Close()
}

// trimPprofTop keeps the useful part of `go tool pprof -top` output: the duration line (CPU
// profiles), the "Showing nodes" summary and the table, without the file, build and filter
// lines.
func trimPprofTop(out string) string {
	var keep []string
	table := false
	for line := range strings.SplitSeq(strings.TrimRight(out, "\n"), "\n") {
		switch {
		case table:
			keep = append(keep, strings.TrimRight(line, " "))
		case strings.HasPrefix(line, "Duration:"), strings.HasPrefix(line, "Showing nodes"):
			keep = append(keep, line)
		case strings.Contains(line, "flat%") && strings.Contains(line, "cum%"):
			keep = append(keep, line)
			table = true
		}
	}
	return strings.Join(keep, "\n")
}

// waitLines renders the off-CPU diagnostics.
func (r tpProfileReport) waitLines() []string {
	var out []string
	for _, p := range r.pools {
		out = append(out, p.text(r.n+r.opts.warmup))
	}
	if len(r.waits) > 0 {
		parts := make([]string, 0, len(r.waits))
		for _, w := range r.waits {
			parts = append(parts, fmt.Sprintf("%s %.2f", w.state, w.mean))
		}
		out = append(out, "Postgres backends of the run's database, mean number in each state (pg_stat_activity every 10 ms): "+
			strings.Join(parts, "; "))
	}
	if line := stagesLine(r.res.stages, r.n); line != "" {
		out = append(out, line)
	}
	if r.redis != "" {
		out = append(out, "Redis (INFO commandstats of the whole server, less the rate of other clients and of idle llmq "+
			"measured over 2 s just before): "+r.redis)
	}
	return out
}

func (r tpProfileReport) notes() []string {
	return []string{
		fmt.Sprintf("llmq's api (internal/api.FromConfig on an httptest server) and one worker (internal/worker.New) run in this "+
			"process, each on its own pool, as internal/e2e does; %d jobs after %d warm-up jobs, %s over HTTP, instant "+
			"provider; %.0f jobs/s in-process, submit→result p50 %s, p99 %s. The CPU profile covers the measured jobs only; the "+
			"allocation listing is the difference of snapshots taken around them. Percentages are of the whole process (clients "+
			"and simulator included).", r.n, r.opts.warmup, r.load, r.res.jobsPerSecond(),
			msText(percentile(r.res.lat, 50)), msText(percentile(r.res.lat, 99))),
		"Files: cpu.pprof, allocs-before.pprof and allocs.pprof in " + r.dir + " (`go tool pprof -http=: cpu.pprof`).",
	}
}

func (r tpProfileReport) text() string {
	var b strings.Builder
	for i, v := range r.views {
		fmt.Fprintf(&b, "\n%s\n\n%s\n", profileViews[i].title, v)
	}
	return b.String() + "\n" + bullets(r.notes()) + "\nWhere the jobs wait:\n" + bullets(r.waitLines())
}

func (r tpProfileReport) markdown() string {
	var b strings.Builder
	b.WriteString("### Profile: where an llmq job's CPU goes\n\n" + r.markdownLine())
	b.WriteString(bullets(r.notes()))
	b.WriteString("\nWhere the jobs wait (the CPU profile shows computing only):\n\n" + bullets(r.waitLines()))
	for i, v := range r.views {
		fmt.Fprintf(&b, "\n%s:\n\n```\n%s\n```\n", profileViews[i].title, v)
	}
	return b.String()
}
