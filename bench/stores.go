package main

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"time"

	"github.com/hibiken/asynq"
	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"

	"github.com/llmq/llmq/internal/redisscript"
)

// cleanupTimeout bounds a cleanup, which runs after the caller's context may have ended.
const cleanupTimeout = 30 * time.Second

// createDatabase creates database name on the server of adminURL and returns its URL and a
// function that drops it (WITH (FORCE), on its own deadline). The api and worker migrate it at
// start-up.
func createDatabase(ctx context.Context, adminURL, name string) (string, func(), error) {
	conn, err := pgx.Connect(ctx, adminURL)
	if err != nil {
		return "", nil, fmt.Errorf("connect to postgres at -database-url: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	ident := pgx.Identifier{name}.Sanitize()
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+ident); err != nil {
		return "", nil, fmt.Errorf("create database %s: %w", name, err)
	}
	u, err := url.Parse(adminURL)
	if err != nil {
		return "", nil, fmt.Errorf("parse -database-url: %w", err)
	}
	u.Path = "/" + name
	drop := func() {
		ctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
		defer cancel()
		c, err := pgx.Connect(ctx, adminURL)
		if err == nil {
			defer c.Close(ctx)
			_, err = c.Exec(ctx, "DROP DATABASE IF EXISTS "+ident+" WITH (FORCE)")
		}
		if err != nil {
			fmt.Fprintf(os.Stderr, "bench: drop database %s: %v (drop it by hand)\n", name, err)
		}
	}
	return u.String(), drop, nil
}

// redisFor connects to the Redis at redisURL as asynq does and returns its options and a
// go-redis client.
func redisFor(ctx context.Context, redisURL string) (asynq.RedisConnOpt, redis.UniversalClient, error) {
	opt, err := asynq.ParseRedisURI(redisURL)
	if err != nil {
		return nil, nil, fmt.Errorf("parse redis url: %w", err)
	}
	rdb, ok := opt.MakeRedisClient().(redis.UniversalClient)
	if !ok {
		return nil, nil, errors.New("asynq returned an unexpected redis client type")
	}
	if err := rdb.Ping(ctx).Err(); err != nil {
		rdb.Close()
		return nil, nil, fmt.Errorf("redis at %s: %w", redisURL, err)
	}
	return opt, rdb, nil
}

// cleanQueue removes every key of an asynq queue and of llmq's low queue named after it
// ("<queue>:low"), and their entries in asynq's queue set, without touching anything else in the
// shared Redis, on its own deadline.
func cleanQueue(rdb redis.UniversalClient, queue string) {
	ctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
	defer cancel()
	for _, q := range []string{queue, queue + ":low"} {
		unlinkMatching(ctx, rdb, "asynq:{"+q+"}:*")
		rdb.SRem(ctx, "asynq:queues", q)
	}
}

// cleanLLMQRedis removes a run's asynq queue and the limiter's and breaker's keys of its
// credential (tagged with the SHA-256 of the credential's LimiterID; they would also expire on
// their own), on its own deadline.
func cleanLLMQRedis(redisURL, queue, limiterID string) {
	ctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
	defer cancel()
	_, rdb, err := redisFor(ctx, redisURL)
	if err != nil {
		return
	}
	defer rdb.Close()
	cleanQueue(rdb, queue)
	tag := redisscript.CredentialTag(limiterID) // in the name of every key of the credential
	unlinkMatching(ctx, rdb, "*"+tag+"*")
	unindexCredential(ctx, rdb, redisscript.CredentialIndexKey(redisscript.DefaultPrefix), tag)
}

// unindexScript removes the fields of hash KEYS[1] whose value is ARGV[1]; Redis deletes the
// hash with its last field.
var unindexScript = redis.NewScript(`
local kv = redis.call('HGETALL', KEYS[1])
for i = 1, #kv, 2 do
  if kv[i + 1] == ARGV[1] then redis.call('HDEL', KEYS[1], kv[i]) end
end
return 0`)

// unindexCredential removes a run's credential from the workers' credential index (key; the
// workers write name → tag there at start): its name's field when it still points at the run's
// tag, so that a run beside it on the same Redis keeps its own.
func unindexCredential(ctx context.Context, rdb redis.UniversalClient, key, tag string) {
	_ = unindexScript.Run(ctx, rdb, []string{key}, tag).Err()
}

// unlinkMatching removes the keys matching pattern, using SCAN so Redis is never blocked.
func unlinkMatching(ctx context.Context, rdb redis.UniversalClient, pattern string) {
	iter := rdb.Scan(ctx, 0, pattern, 500).Iterator()
	var batch []string
	for iter.Next(ctx) {
		batch = append(batch, iter.Val())
		if len(batch) == 500 {
			rdb.Unlink(ctx, batch...)
			batch = batch[:0]
		}
	}
	if len(batch) > 0 {
		rdb.Unlink(ctx, batch...)
	}
}
