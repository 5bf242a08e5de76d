package process_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/logtest"
	"github.com/llmq/llmq/internal/process"
	"github.com/llmq/llmq/internal/redistest"
)

// msgEviction is the start-up warning of a Redis that may evict llmq's keys.
const msgEviction = "redis may evict llmq's keys"

// msgUnread is the start-up line of a Redis whose policy could not be read.
const msgUnread = "could not read redis's maxmemory-policy; it must be noeviction"

// An API or a worker started on a Redis whose maxmemory-policy may evict keys (any but
// noeviction, with a memory limit) says so at start, naming the policy and the fix: an evicted
// task, limiter bucket or pause is lost without a word. On noeviction, or without a memory limit
// (maxmemory 0: nothing is evicted, whatever the policy), it says nothing; where CONFIG is
// refused (a managed Redis) it says once, at info, that the policy could not be read and must be
// noeviction. Each case has a private Redis: the policy is never changed on a shared one.
func TestProcesses_WarnOfARedisThatMayEvict(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name, process, policy, maxmemory string
		refuseConfig, warn               bool
	}{
		{name: "APIAllKeysLRU", process: "api", policy: "allkeys-lru", maxmemory: "1gb", warn: true},
		{name: "WorkerVolatileLRU", process: "worker", policy: "volatile-lru", maxmemory: "1gb", warn: true},
		{name: "APINoEviction", process: "api", policy: "noeviction", maxmemory: "1gb"},
		{name: "WorkerNoMemoryLimit", process: "worker", policy: "allkeys-lru", maxmemory: "0"},
		{name: "WorkerConfigRefused", process: "worker", policy: "allkeys-lru", maxmemory: "1gb", refuseConfig: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			redisURL := redistest.Server(t)
			opt, err := redis.ParseURL(redisURL)
			require.NoError(t, err)
			rdb := redis.NewClient(opt)
			t.Cleanup(func() { _ = rdb.Close() })
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			require.NoError(t, rdb.ConfigSet(ctx, "maxmemory-policy", tc.policy).Err())
			require.NoError(t, rdb.ConfigSet(ctx, "maxmemory", tc.maxmemory).Err())
			if tc.refuseConfig {
				require.NoError(t, rdb.Do(ctx, "ACL", "SETUSER", "default", "-config").Err())
			}
			path := writeConfigOn(t, "http://127.0.0.1:1", redisURL) // no call is made

			runCtx, stop := context.WithCancel(ctx)
			defer stop()
			logs := &logtest.Buffer{}
			done := make(chan error, 1)
			o := process.Options{Stderr: logs, Getenv: getenv}
			run, started := process.API, "api listening"
			if tc.process == "worker" {
				run, started = process.Worker, "worker started"
			}
			go func() { done <- run(runCtx, []string{"--config", path}, o) }()
			for logs.Count(started) == 0 {
				select {
				case err := <-done:
					t.Fatalf("the process ended before it started: %v\n%s", err, logs.String())
				case <-ctx.Done():
					t.Fatalf("the process did not start within a minute: %s", logs.String())
				case <-time.After(20 * time.Millisecond): // polling the log; nothing signals a line
				}
			}
			stop()
			select {
			case err := <-done:
				require.NoError(t, err)
			case <-ctx.Done():
				t.Fatal("the process did not stop")
			}
			if tc.refuseConfig {
				require.Equal(t, 1, logs.Count(msgUnread), logs.String())
				require.Contains(t, logs.String(), `"level":"INFO","msg":"`+msgUnread)
			} else {
				require.Zero(t, logs.Count(msgUnread), logs.String())
			}
			if !tc.warn {
				require.Zero(t, logs.Count(msgEviction), logs.String())
				return
			}
			require.Equal(t, 1, logs.Count(msgEviction), logs.String())
			line := logs.String()
			require.Contains(t, line, `"maxmemory_policy":"`+tc.policy+`"`)
			require.Contains(t, line, "noeviction", "the line names the fix")
		})
	}
}

// A redis_url naming a database the Redis does not have (/99 where it has 16) stops each process
// at start with an error naming the setting and the database: every command on it fails ("ERR DB
// index is out of range"), so the process ran without ever dispatching a job, logging asynq's
// errors forever.
func TestProcesses_RefuseARedisDatabaseThatDoesNotExist(t *testing.T) {
	t.Parallel()
	for name, run := range map[string]func(context.Context, []string, process.Options) error{
		"API": process.API, "Worker": process.Worker, "Serve": process.Serve,
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			redisURL := strings.TrimSuffix(redistest.Server(t), "/0") + "/99" // a private Redis: 16 databases
			path := writeConfigOn(t, "http://127.0.0.1:1", redisURL)          // no call is made
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			logs := &logtest.Buffer{}
			done := make(chan error, 1)
			go func() { done <- run(ctx, []string{"--config", path}, process.Options{Stderr: logs, Getenv: getenv}) }()
			select {
			case err := <-done:
				require.ErrorContains(t, err, "redis_url: Redis has no database 99")
			case <-time.After(30 * time.Second):
				cancel()
				<-done
				t.Fatalf("the process ran on a database its Redis does not have: %s", logs.String())
			}
		})
	}
}
