package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"time"

	"github.com/redis/go-redis/v9"
)

// startPrivateRedis starts a redis-server of its own on a free port, without persistence, so
// that the run may FLUSHALL it. It returns its URL and a function that kills it and removes
// its directory.
func startPrivateRedis(ctx context.Context, binary string) (string, func(), error) {
	addr, err := freeAddr()
	if err != nil {
		return "", nil, err
	}
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", nil, fmt.Errorf("free address %s: %w", addr, err)
	}
	dir, err := os.MkdirTemp("", "llmq-bench-redis-")
	if err != nil {
		return "", nil, fmt.Errorf("create redis dir: %w", err)
	}
	p, err := startProc(binary, "redis", dir, nil, "--port", port, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", dir)
	if err != nil {
		os.RemoveAll(dir)
		return "", nil, fmt.Errorf("%w (pass -redis-server)", err)
	}
	stop := func() {
		_ = p.cmd.Process.Kill()
		<-p.done
		os.RemoveAll(dir)
	}
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	defer rdb.Close()
	deadline := time.Now().Add(10 * time.Second)
	for rdb.Ping(ctx).Err() != nil {
		if err := p.exited(); err != nil {
			stop()
			return "", nil, err
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			stop()
			return "", nil, errors.New("private redis-server did not answer PING within 10 s")
		}
		time.Sleep(20 * time.Millisecond) // polling a process start-up: there is nothing to wait on
	}
	return "redis://" + addr + "/0", stop, nil
}
