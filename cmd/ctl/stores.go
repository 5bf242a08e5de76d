package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/hibiken/asynq"
	"github.com/urfave/cli/v2"

	"github.com/llmq/llmq/internal/config"
	"github.com/llmq/llmq/internal/dispatch"
)

// fileConfig loads --config when given; nil without it.
func fileConfig(c *cli.Context) (*config.Config, error) {
	p := c.String("config")
	if p == "" {
		return nil, nil
	}
	return config.LoadWithoutSecrets(p, nil)
}

// redisTarget resolves the Redis URL (--redis-url, else the config file, else the default) and
// the asynq queue (--queue, else the config file, else "llmq").
func redisTarget(c *cli.Context) (url, queue string, err error) {
	url, queue = c.String("redis-url"), c.String("queue")
	if url != "" && queue != "" {
		return url, queue, nil
	}
	cfg, err := fileConfig(c)
	if err != nil {
		return "", "", err
	}
	if cfg == nil {
		cfg = &config.Config{RedisURL: config.DefaultRedisURL, Worker: config.Worker{Queue: "llmq"}}
	}
	if url == "" {
		url = cfg.RedisURL
	}
	if queue == "" {
		queue = cfg.Worker.Queue
	}
	return url, queue, nil
}

// errRedisUnreachable is openTasks' error when Redis did not answer (its URL parsed).
var errRedisUnreachable = errors.New("redis unreachable")

// openTasks connects to the Redis that dispatches jobs, failing fast with a one-line error when
// it does not answer. close releases the connections.
func openTasks(c *cli.Context) (tasks *dispatch.Tasks, close func(), err error) {
	url, queue, err := redisTarget(c)
	if err != nil {
		return nil, nil, err
	}
	opt, err := dispatch.RedisConnOpt(url)
	if err != nil {
		return nil, nil, err
	}
	rdb := dispatch.NewRedisClient(opt)
	ctx, cancel := context.WithTimeout(c.Context, 5*time.Second)
	err = rdb.Ping(ctx).Err()
	cancel()
	if err != nil {
		_ = rdb.Close()
		return nil, nil, fmt.Errorf("%w: %w", errRedisUnreachable, err)
	}
	client := asynq.NewClient(opt)
	insp := asynq.NewInspector(opt)
	// A requeued job wakes an idle worker (rdb).
	return dispatch.NewTasks(insp, dispatch.NewEnqueuer(client, queue, rdb)), func() {
		_ = insp.Close()
		_ = client.Close()
		_ = rdb.Close()
	}, nil
}

// parseAge parses a duration such as "90m", "24h" or "7d" (days are 24h).
func parseAge(flag, s string) (time.Duration, error) {
	if days, ok := strings.CutSuffix(s, "d"); ok {
		n, err := strconv.ParseFloat(days, 64)
		if err == nil && n > 0 && n*float64(24*time.Hour) < math.MaxInt64 { // a Duration holds ~292 years
			return time.Duration(n * float64(24*time.Hour)), nil
		}
	}
	d, err := time.ParseDuration(s)
	if err != nil || d <= 0 {
		return 0, cli.Exit(fmt.Sprintf("--%s %q: want a positive duration such as 30m, 24h or 7d", flag, s), exitUsage)
	}
	return d, nil
}

// requestModel returns the "model" of a provider request body, or "-".
func requestModel(req []byte) string {
	var body struct {
		Model string `json:"model"`
	}
	if err := json.Unmarshal(req, &body); err != nil || body.Model == "" {
		return "-"
	}
	return body.Model
}

// printable is s for a terminal: s itself, or, when s holds a character that is not printable
// (a terminal escape sequence, a bidirectional override), s quoted and escaped. For a tenant's
// text in a table (JSON output escapes them already).
func printable(s string) string {
	if strings.ContainsFunc(s, func(r rune) bool { return !strconv.IsPrint(r) }) {
		return strconv.Quote(s)
	}
	return s
}

// oneLineText shortens s to n runes on one line, for table cells.
func oneLineText(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if r := []rune(s); len(r) > n {
		return string(r[:n-1]) + "…"
	}
	return s
}

// ts formats an optional time for tables.
func ts(t *time.Time) string {
	if t == nil {
		return "-"
	}
	return t.Format(time.RFC3339)
}
