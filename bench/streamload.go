package main

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// deltaPathCommands are the Redis commands of the delta path: the worker's XREVRANGE, XADD,
// PEXPIRE and PUBLISH per write (inside one script), the API's XRANGE when a stream opens, after
// a status event, or when a published batch may be missing.
var deltaPathCommands = []string{"xrevrange", "xadd", "pexpire", "publish", "xrange"}

// loadSample is cumulative resource use at one moment: the API and worker processes' CPU and
// the (private) Redis server's counters.
type loadSample struct {
	apiCPU, workerCPU, redisCPU time.Duration
	benchCPU                    time.Duration // this process: the clients and the simulator
	commands, netIn, netOut     int64
	deltaCommands               int64 // calls of deltaPathCommands
}

// sampleLoad reads the processes' CPU from /proc and Redis's INFO stats and commandstats.
func sampleLoad(ctx context.Context, rdb redis.UniversalClient, apiPIDs, workerPIDs []int) (loadSample, error) {
	var s loadSample
	for _, g := range []struct {
		pids []int
		sum  *time.Duration
	}{{apiPIDs, &s.apiCPU}, {workerPIDs, &s.workerCPU}} {
		for _, pid := range g.pids {
			c, err := procCPU(pid)
			if err != nil {
				return s, err
			}
			*g.sum += c
		}
	}
	var err error
	if s.benchCPU, err = selfCPU(); err != nil {
		return s, err
	}
	if s.redisCPU, err = redisCPU(ctx, rdb); err != nil {
		return s, err
	}
	info, err := rdb.Info(ctx, "stats", "commandstats").Result()
	if err != nil {
		return s, fmt.Errorf("redis info: %w", err)
	}
	fields := infoFields(info)
	for _, f := range []struct {
		key string
		v   *int64
	}{{"total_commands_processed", &s.commands}, {"total_net_input_bytes", &s.netIn}, {"total_net_output_bytes", &s.netOut}} {
		if *f.v, err = strconv.ParseInt(fields[f.key], 10, 64); err != nil {
			return s, fmt.Errorf("redis info %s: %w", f.key, err)
		}
	}
	for _, c := range deltaPathCommands {
		s.deltaCommands += commandCalls(fields["cmdstat_"+c])
	}
	return s, nil
}

// sub returns s − before.
func (s loadSample) sub(before loadSample) loadSample {
	return loadSample{apiCPU: s.apiCPU - before.apiCPU, workerCPU: s.workerCPU - before.workerCPU,
		redisCPU: s.redisCPU - before.redisCPU, benchCPU: s.benchCPU - before.benchCPU, commands: s.commands - before.commands,
		netIn: s.netIn - before.netIn, netOut: s.netOut - before.netOut, deltaCommands: s.deltaCommands - before.deltaCommands}
}

// infoFields maps the "key:value" lines of an INFO answer.
func infoFields(info string) map[string]string {
	out := map[string]string{}
	for line := range strings.SplitSeq(info, "\n") {
		if k, v, ok := strings.Cut(strings.TrimSpace(line), ":"); ok {
			out[k] = v
		}
	}
	return out
}

// commandCalls is calls=N of a commandstats value ("calls=N,usec=..."); 0 when absent.
func commandCalls(v string) int64 {
	for f := range strings.SplitSeq(v, ",") {
		if n, ok := strings.CutPrefix(f, "calls="); ok {
			c, _ := strconv.ParseInt(n, 10, 64)
			return c
		}
	}
	return 0
}
