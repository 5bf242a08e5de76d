// Package redistest gives each test an isolated slice of the real Redis on 127.0.0.1, and of the
// real Redis Cluster beside it (scripts/redis-cluster.sh starts it).
//
// Tests never FLUSHDB: each one gets a unique key prefix (and, for asynq, a unique queue name)
// and its keys are removed in t.Cleanup, on every master of a cluster. It is for _test.go files
// only.
package redistest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// DefaultURL is the Redis used when TEST_REDIS_URL is unset.
const DefaultURL = "redis://127.0.0.1:6379/0"

// URL returns TEST_REDIS_URL or DefaultURL.
func URL() string { return envOr("TEST_REDIS_URL", DefaultURL) }

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// Client returns a client to the test Redis, closed in t.Cleanup. The test fails (it does not
// skip) when Redis is unreachable. For a URL that may name a Redis Cluster, use ClientOf.
func Client(t testing.TB) *redis.Client {
	t.Helper()
	opt, err := redis.ParseURL(URL())
	if err != nil {
		t.Fatalf("parse TEST_REDIS_URL: %v", err)
	}
	c := redis.NewClient(opt)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatalf("redis unreachable at %s: %v", URL(), err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// Prefix returns a fresh key prefix "llmq:test:<rand>:" and removes every key under it when the
// test ends.
func Prefix(t testing.TB) string {
	t.Helper()
	return PrefixOn(t, URL())
}

// PrefixOn is Prefix on the Redis (or Redis Cluster) at url.
func PrefixOn(t testing.TB, url string) string {
	t.Helper()
	p := "llmq:test:" + Rand() + ":"
	c := ClientOf(t, url)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		Unlink(ctx, c, p+"*")
	})
	return p
}

// Unlink removes every key matching pattern, using SCAN so Redis is never blocked; on a Redis
// Cluster it scans every master (a SCAN sent to the cluster client reaches one node only), and
// removes the keys one UNLINK each, since keys of several slots cannot share a command.
func Unlink(ctx context.Context, c redis.UniversalClient, pattern string) {
	if cc, ok := c.(*redis.ClusterClient); ok {
		_ = cc.ForEachMaster(ctx, func(ctx context.Context, node *redis.Client) error {
			unlinkOn(ctx, node, pattern)
			return nil
		})
		return
	}
	unlinkOn(ctx, c, pattern)
}

// unlinkOn removes the keys of one node that match pattern, 500 a round trip.
func unlinkOn(ctx context.Context, c redis.Cmdable, pattern string) {
	iter := c.Scan(ctx, 0, pattern, 500).Iterator()
	var batch []string
	flush := func() {
		pipe := c.Pipeline()
		for _, k := range batch {
			pipe.Unlink(ctx, k)
		}
		_, _ = pipe.Exec(ctx)
		batch = batch[:0]
	}
	for iter.Next(ctx) {
		batch = append(batch, iter.Val())
		if len(batch) == 500 {
			flush()
		}
	}
	if len(batch) > 0 {
		flush()
	}
}

// Rand returns 16 random hex characters, for unique names.
func Rand() string {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err)
	}
	return hex.EncodeToString(b[:])
}

// Server starts a private redis-server on a free loopback port for tests that must do what no
// shared Redis allows (FLUSHALL, a restart). It is stopped when the test ends. It returns the URL.
func Server(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("find a free port: %v", err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	_ = ln.Close()
	startServer(t, port, t.TempDir())
	return fmt.Sprintf("redis://127.0.0.1:%d/0", port)
}

// startServer starts redis-server on 127.0.0.1:port with its files in dir, keeping nothing on
// disk, with args added; it is stopped when the test ends. It returns a client to it, closed
// when the test ends, once it answers.
func startServer(t testing.TB, port int, dir string, args ...string) *redis.Client {
	t.Helper()
	cmd := exec.Command("redis-server", append([]string{"--port", strconv.Itoa(port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", dir}, args...)...)
	if err := cmd.Start(); err != nil {
		t.Fatalf("start redis-server: %v", err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:" + strconv.Itoa(port)})
	t.Cleanup(func() { _ = c.Close() })
	deadline := time.Now().Add(10 * time.Second)
	for c.Ping(context.Background()).Err() != nil {
		if time.Now().After(deadline) {
			t.Fatalf("private redis-server on port %d did not answer", port)
		}
		time.Sleep(20 * time.Millisecond) // polling a process start-up; there is no signal to wait on
	}
	return c
}
