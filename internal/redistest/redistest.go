// Package redistest gives each test an isolated slice of the real Redis on 127.0.0.1.
//
// Tests never FLUSHDB: each one gets a unique key prefix (and, for asynq, a unique queue name)
// and its keys are removed in t.Cleanup. It is for _test.go files only.
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
func URL() string {
	if u := os.Getenv("TEST_REDIS_URL"); u != "" {
		return u
	}
	return DefaultURL
}

// Client returns a client to the test Redis, closed in t.Cleanup. The test fails (it does not
// skip) when Redis is unreachable.
func Client(t testing.TB) *redis.Client {
	t.Helper()
	opt, err := redis.ParseURL(URL())
	if err != nil {
		t.Fatalf("parse TEST_REDIS_URL: %v", err)
	}
	c := redis.NewClient(opt)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
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
	p := "llmq:test:" + Rand() + ":"
	c := Client(t)
	t.Cleanup(func() { Unlink(context.Background(), c, p+"*") })
	return p
}

// Unlink removes every key matching pattern, using SCAN so Redis is never blocked.
func Unlink(ctx context.Context, c redis.UniversalClient, pattern string) {
	iter := c.Scan(ctx, 0, pattern, 500).Iterator()
	var batch []string
	for iter.Next(ctx) {
		batch = append(batch, iter.Val())
		if len(batch) == 500 {
			c.Unlink(ctx, batch...)
			batch = batch[:0]
		}
	}
	if len(batch) > 0 {
		c.Unlink(ctx, batch...)
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
	cmd := exec.Command("redis-server", "--port", strconv.Itoa(port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", t.TempDir())
	if err := cmd.Start(); err != nil {
		t.Fatalf("start redis-server: %v", err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	url := fmt.Sprintf("redis://127.0.0.1:%d/0", port)
	opt, _ := redis.ParseURL(url)
	c := redis.NewClient(opt)
	defer c.Close()
	deadline := time.Now().Add(10 * time.Second)
	for c.Ping(context.Background()).Err() != nil {
		if time.Now().After(deadline) {
			t.Fatalf("private redis-server on port %d did not answer", port)
		}
		time.Sleep(20 * time.Millisecond) // polling a process start-up; there is no signal to wait on
	}
	return url
}
