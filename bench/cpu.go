package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"
)

// CPU groups of the throughput tables: where the CPU time of a run went.
const (
	cpuBench    = "bench"    // this process: clients, observer, simulator, and in-process queues
	cpuAPI      = "api"      // the api child process
	cpuWorkers  = "workers"  // the worker child processes, summed
	cpuPostgres = "postgres" // the Postgres backends connected to the row's database
	cpuRedis    = "redis"    // the whole Redis server (shared: other clients count too)
	// cpuSystem is the system (kernel) part of the api and worker processes' CPU: not a column,
	// a note (systemNote). Instruction counts (bench instructions) do not see it.
	cpuSystem = "system"
)

// cpuGroups is the column order of the CPU groups.
var cpuGroups = []string{cpuBench, cpuAPI, cpuWorkers, cpuPostgres, cpuRedis}

// cpuSample is cumulative CPU time (user + system) per group at one moment. A group that cannot
// be read is absent.
type cpuSample map[string]time.Duration

// sub returns s − before per group present in both.
func (s cpuSample) sub(before cpuSample) cpuSample {
	out := cpuSample{}
	for g, v := range s {
		if b, ok := before[g]; ok {
			out[g] = v - b
		}
	}
	return out
}

// clockTick is the unit of the times in /proc/<pid>/stat (USER_HZ, 100 on every Linux ABI).
const clockTick = 10 * time.Millisecond

// parseProcStatCPU returns utime + stime from the text of /proc/<pid>/stat.
func parseProcStatCPU(stat string) (time.Duration, error) {
	user, system, err := parseProcStatTimes(stat)
	return user + system, err
}

// parseProcStatTimes returns utime and stime from the text of /proc/<pid>/stat. The command name
// (field 2) may hold spaces and parentheses, so fields are counted after its last ')'.
func parseProcStatTimes(stat string) (user, system time.Duration, err error) {
	i := strings.LastIndexByte(stat, ')')
	if i < 0 {
		return 0, 0, errors.New("proc stat: no command name")
	}
	f := strings.Fields(stat[i+1:])
	// f[0] is field 3 (state); utime and stime are fields 14 and 15.
	if len(f) < 13 {
		return 0, 0, fmt.Errorf("proc stat: %d fields after the command name, want at least 13", len(f))
	}
	var ticks [2]int64
	for j, s := range f[11:13] {
		if ticks[j], err = strconv.ParseInt(s, 10, 64); err != nil {
			return 0, 0, fmt.Errorf("proc stat: %w", err)
		}
	}
	return time.Duration(ticks[0]) * clockTick, time.Duration(ticks[1]) * clockTick, nil
}

// procCPU returns the CPU time of process pid so far (Linux only).
func procCPU(pid int) (time.Duration, error) {
	user, system, err := procTimes(pid)
	return user + system, err
}

// procTimes returns the user and system CPU time of process pid so far (Linux only).
func procTimes(pid int) (user, system time.Duration, err error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, 0, fmt.Errorf("read cpu of pid %d: %w", pid, err)
	}
	return parseProcStatTimes(string(b))
}

// parseRedisCPU returns used_cpu_sys + used_cpu_user from the text of Redis's INFO cpu.
func parseRedisCPU(info string) (time.Duration, error) {
	var total float64
	found := 0
	for line := range strings.SplitSeq(info, "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || (k != "used_cpu_sys" && k != "used_cpu_user") {
			continue
		}
		f, err := strconv.ParseFloat(v, 64)
		if err != nil {
			return 0, fmt.Errorf("redis info %s: %w", k, err)
		}
		total += f
		found++
	}
	if found != 2 {
		return 0, errors.New("redis info: used_cpu_sys or used_cpu_user missing")
	}
	return time.Duration(total * float64(time.Second)), nil
}

// redisCPU returns the Redis server's CPU time so far.
func redisCPU(ctx context.Context, rdb redis.UniversalClient) (time.Duration, error) {
	info, err := rdb.Info(ctx, "cpu").Result()
	if err != nil {
		return 0, fmt.Errorf("redis info cpu: %w", err)
	}
	return parseRedisCPU(info)
}

// backendCPU is the CPU time of each Postgres backend (by pid) at one moment.
type backendCPU map[int]time.Duration

// since returns the CPU the backends of b spent after before: the growth of those present in
// both, plus the whole time of those that appeared. Backends that ended in between are lost
// (their connections are held for the whole measurement, so there should be none).
func (b backendCPU) since(before backendCPU) time.Duration {
	var d time.Duration
	for pid, v := range b {
		d += v - before[pid]
	}
	return d
}

// observerApp is the application_name of the benchmark's own connections to a run's database
// (the completion observer), whose backends are not counted as the system's.
const observerApp = "llmq-bench-observer"

// postgresBackends reads the CPU time of every backend connected to database db, except the
// benchmark's observers. It connects to the server at adminURL (another database) to ask, and
// needs Postgres on this machine (/proc).
func postgresBackends(ctx context.Context, adminURL, db string) (backendCPU, error) {
	conn, err := pgx.Connect(ctx, adminURL)
	if err != nil {
		return nil, fmt.Errorf("list postgres backends: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	rows, err := conn.Query(ctx, `SELECT pid FROM pg_stat_activity WHERE datname = $1 AND application_name <> $2`, db, observerApp)
	if err != nil {
		return nil, fmt.Errorf("list postgres backends: %w", err)
	}
	pids, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	if err != nil {
		return nil, fmt.Errorf("list postgres backends: %w", err)
	}
	out := backendCPU{}
	for _, pid := range pids {
		v, err := procCPU(int(pid))
		if errors.Is(err, os.ErrNotExist) {
			continue // the backend ended between the query and the read
		}
		if err != nil {
			return nil, err
		}
		out[int(pid)] = v
	}
	return out, nil
}

// walUse is the WAL a run wrote, in bytes; ok is false when it could not be read (no server
// to ask).
type walUse struct {
	bytes int64
	ok    bool
}

// readWALPosition reads the server's current WAL insert position at adminURL, in bytes. The WAL
// is the whole server's, every database's: a run's share is its own only while nothing else
// writes (the bench runs one system at a time). The position moves as records are inserted;
// pg_stat_wal's counters would count records too, but a backend reports them up to 10 s late.
func readWALPosition(ctx context.Context, adminURL string) (int64, error) {
	conn, err := pgx.Connect(ctx, adminURL)
	if err != nil {
		return 0, fmt.Errorf("read the WAL position: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var pos int64
	if err := conn.QueryRow(ctx, `SELECT (pg_current_wal_insert_lsn() - '0/0')::bigint`).Scan(&pos); err != nil {
		return 0, fmt.Errorf("read the WAL position: %w", err)
	}
	return pos, nil
}

// walNote says how much WAL the run wrote per job, or "" when it was not measured.
func walNote(r tpResult) string {
	if !r.wal.ok || r.n == 0 {
		return ""
	}
	return fmt.Sprintf("Postgres's WAL %.2f kB per job", float64(r.wal.bytes)/1024/float64(r.n))
}

// cpuMeter samples the CPU groups of one row: this process always, the given child processes,
// the row database's Postgres backends and Redis when their handles are set.
type cpuMeter struct {
	api      int    // pid of the api process; 0: none
	workers  []int  // pids of the worker processes
	adminURL string // Postgres server to ask about the backends of db; empty: not measured
	db       string
	rdb      redis.UniversalClient
	// pgStart is the backends' CPU at the first sample, kept so that the delta can follow pids.
	pgStart backendCPU
	// walStart is the server's WAL position at the first sample (walStartOK: read).
	walStart   int64
	walStartOK bool
}

// start takes the first sample.
func (m *cpuMeter) start(ctx context.Context) cpuSample { return m.sample(ctx, true) }

// stop takes the second sample and returns the CPU spent since start per group.
func (m *cpuMeter) stop(ctx context.Context, start cpuSample) cpuSample {
	return m.sample(ctx, false).sub(start)
}

// wal is the WAL the server wrote between the first sample and now (not measured without a
// Postgres server).
func (m *cpuMeter) wal(ctx context.Context) walUse {
	if !m.walStartOK {
		return walUse{}
	}
	pos, err := readWALPosition(ctx, m.adminURL)
	if err != nil {
		return walUse{}
	}
	return walUse{bytes: pos - m.walStart, ok: true}
}

func (m *cpuMeter) sample(ctx context.Context, first bool) cpuSample {
	s := cpuSample{}
	if d, err := selfCPU(); err == nil {
		s[cpuBench] = d
	}
	var system time.Duration
	systemOK := m.api != 0 || len(m.workers) > 0
	if m.api != 0 {
		if u, sys, err := procTimes(m.api); err == nil {
			s[cpuAPI] = u + sys
			system += sys
		} else {
			systemOK = false
		}
	}
	if len(m.workers) > 0 {
		var sum time.Duration
		ok := true
		for _, pid := range m.workers {
			u, sys, err := procTimes(pid)
			if err != nil {
				ok = false
				break
			}
			sum += u + sys
			system += sys
		}
		if ok {
			s[cpuWorkers] = sum
		}
		systemOK = systemOK && ok
	}
	if systemOK {
		s[cpuSystem] = system
	}
	if m.adminURL != "" {
		if first {
			m.walStart, m.walStartOK = 0, false
			if pos, err := readWALPosition(ctx, m.adminURL); err == nil {
				m.walStart, m.walStartOK = pos, true
			}
		}
		if b, err := postgresBackends(ctx, m.adminURL, m.db); err == nil {
			if first {
				m.pgStart = b
				s[cpuPostgres] = 0
			} else if m.pgStart != nil {
				s[cpuPostgres] = b.since(m.pgStart)
			}
		}
	}
	if m.rdb != nil {
		if d, err := redisCPU(ctx, m.rdb); err == nil {
			s[cpuRedis] = d
		}
	}
	return s
}

// cpuPer1000 is the group's CPU seconds per 1,000 jobs of r; ok is false when it was not
// measured.
func (r tpResult) cpuPer1000(group string) (float64, bool) {
	d, ok := r.cpu[group]
	if !ok || r.n == 0 {
		return 0, false
	}
	return d.Seconds() * 1000 / float64(r.n), true
}

// cpuTotalPer1000 is r's CPU seconds per 1,000 jobs over every group measured.
func (r tpResult) cpuTotalPer1000() float64 {
	var total float64
	for _, g := range cpuGroups {
		if v, ok := r.cpuPer1000(g); ok {
			total += v
		}
	}
	return total
}

// cpuCells renders r's CPU per 1,000 jobs in cpuGroups' order ("—": not measured).
func cpuCells(r tpResult) []string {
	out := make([]string, len(cpuGroups))
	for i, g := range cpuGroups {
		out[i] = "—"
		if v, ok := r.cpuPer1000(g); ok {
			out[i] = fmt.Sprintf("%.2f", v)
		}
	}
	return out
}

// systemNote says what share of the api and worker processes' CPU was system time, or "" when
// it was not measured.
func systemNote(r tpResult) string {
	sys, ok := r.cpu[cpuSystem]
	total := r.cpu[cpuAPI] + r.cpu[cpuWorkers]
	if !ok || total <= 0 {
		return ""
	}
	return fmt.Sprintf("its processes' CPU %.0f%% system time", 100*sys.Seconds()/total.Seconds())
}
