package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/hibiken/asynq"
	"github.com/urfave/cli/v2"

	"github.com/llmq/llmq/internal/config"
	"github.com/llmq/llmq/internal/dispatch"
	"github.com/llmq/llmq/internal/jobs"
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

// errRedisStalled is a ctlTasks error when Redis stopped answering after openTasks' ping.
var errRedisStalled = errors.New("redis did not answer")

// defaultRedisWait bounds openTasks' ping and each of a command's steps on Redis (see ctlTasks).
const defaultRedisWait = 5 * time.Second

// openTasks connects to the Redis that dispatches jobs, failing fast with a one-line error when
// it does not answer within a.redisWait. close releases the connections.
func (a *app) openTasks(c *cli.Context) (tasks *ctlTasks, close func(), err error) {
	opt, queue, err := redisConn(c)
	if err != nil {
		return nil, nil, err
	}
	return a.connectTasks(c.Context, opt, queue)
}

// redisConn resolves and parses the Redis URL (see redisTarget), and the asynq queue.
func redisConn(c *cli.Context) (opt asynq.RedisConnOpt, queue string, err error) {
	url, queue, err := redisTarget(c)
	if err != nil {
		return nil, "", err
	}
	if opt, err = dispatch.RedisConnOpt(url); err != nil {
		return nil, "", err
	}
	return opt, queue, nil
}

// connectTasks is openTasks on the Redis of opt.
func (a *app) connectTasks(ctx context.Context, opt asynq.RedisConnOpt, queue string) (tasks *ctlTasks, close func(), err error) {
	rdb := dispatch.NewRedisClient(opt)
	ctx, cancel := context.WithTimeout(ctx, a.redisWait)
	err = rdb.Ping(ctx).Err()
	cancel()
	if err != nil {
		_ = rdb.Close()
		return nil, nil, fmt.Errorf("%w: %w", errRedisUnreachable, err)
	}
	client := asynq.NewClient(opt)
	insp := asynq.NewInspector(opt)
	// A requeued job wakes an idle worker (rdb).
	t := &ctlTasks{tasks: dispatch.NewTasks(insp, dispatch.NewEnqueuer(client, queue, rdb)), wait: a.redisWait}
	return t, func() {
		// Closed, the clients end a step still waiting on a stalled Redis at once.
		_ = insp.Close()
		_ = client.Close()
		_ = rdb.Close()
		t.running.Wait()
	}, nil
}

// ctlTasks is dispatch.Tasks for one ctl command, bounded for an operator at a terminal: each
// step (a job's requeue, abort, the queue's depth) that Redis has not answered within wait
// fails with errRedisStalled, and once one has, every later step fails so at once, so that a
// command over many jobs ends within about wait rather than waiting out each of its Redis
// commands' timeouts and retries in turn (asynq's inspector takes no context: ~20 s a command).
// What the command did in Postgres stands (a job set queued is enqueued by the sweeper, a
// canceled job's attempt stops at its lease's next renewal). Not for concurrent use.
type ctlTasks struct {
	tasks   *dispatch.Tasks
	wait    time.Duration
	stalled error          // the first errRedisStalled, when one was
	running sync.WaitGroup // steps given up on, until the clients are closed
}

// do runs step, waiting at most t.wait (and while ctx lasts) for it; past that the step goes on
// in the background until openTasks' close.
func (t *ctlTasks) do(ctx context.Context, step func() error) error {
	if t.stalled != nil {
		return t.stalled
	}
	done := make(chan error, 1)
	t.running.Add(1)
	go func() {
		defer t.running.Done()
		done <- step()
	}()
	timer := time.NewTimer(t.wait)
	defer timer.Stop()
	select {
	case err := <-done:
		return err
	case <-timer.C:
		t.stalled = fmt.Errorf("%w within %s (nothing more was sent to it)", errRedisStalled, t.wait)
		return t.stalled
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Requeue is dispatch.Tasks.Requeue, bounded.
func (t *ctlTasks) Requeue(ctx context.Context, id string, p jobs.Priority) error {
	return t.do(ctx, func() error { return t.tasks.Requeue(ctx, id, p) })
}

// AbortEnded is dispatch.Tasks.AbortEnded, bounded (by ctx too).
func (t *ctlTasks) AbortEnded(ctx context.Context, job *jobs.Job) error {
	return t.do(ctx, func() error { return t.tasks.AbortEnded(job) })
}

// Depth is dispatch.Tasks.Depth, bounded.
func (t *ctlTasks) Depth(ctx context.Context) (d dispatch.QueueDepth, err error) {
	err = t.do(ctx, func() error {
		var derr error
		d, derr = t.tasks.Depth()
		return derr
	})
	return d, err
}

// parseAge parses a duration such as "90m", "24h" or "7d" (days are 24h).
func parseAge(flag, s string) (time.Duration, error) {
	if days, ok := strings.CutSuffix(s, "d"); ok {
		n, err := strconv.ParseFloat(days, 64)
		// A Duration holds ~292 years; a fraction of a nanosecond would be 0, no bound at all.
		if d := time.Duration(n * float64(24*time.Hour)); err == nil && n*float64(24*time.Hour) < math.MaxInt64 && d > 0 {
			return d, nil
		}
	}
	d, err := time.ParseDuration(s)
	if err != nil || d <= 0 {
		return 0, cli.Exit(fmt.Sprintf("--%s %q: want a positive duration such as 30m, 24h or 7d, at most %dd", flag, s,
			int64(math.MaxInt64/int64(24*time.Hour))), exitUsage)
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

// plural returns one when n is 1 and many otherwise: the words a message says of n things
// ("belongs to a credential", "belong to credentials"; "it", "them").
func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}

// ts formats an optional time for tables.
func ts(t *time.Time) string {
	if t == nil {
		return "-"
	}
	return t.Format(time.RFC3339)
}
