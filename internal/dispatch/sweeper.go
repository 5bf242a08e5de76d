package dispatch

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/hibiken/asynq"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/llmq/llmq/internal/jobs"
	"github.com/llmq/llmq/internal/leader"
	"github.com/llmq/llmq/internal/logstreak"
)

// sweeperLockKey elects the one sweeping process ("llmqswep").
const sweeperLockKey int64 = 0x6c6c6d7173776570

// SweeperConfig configures a Sweeper.
type SweeperConfig struct {
	Store     *jobs.Store
	Enqueuer  *Enqueuer
	Inspector *asynq.Inspector
	// Redis is asynq's Redis, where the sweeper reads the state of a page of tasks in one
	// pipelined round trip (asynq's Inspector asks one task per call). The queues are the
	// Enqueuer's.
	Redis redis.UniversalClient
	// Interval between sweeps. Default 10s.
	Interval time.Duration
	// OrphanGrace is how long a job's task must look orphaned (active in asynq, but on no live
	// worker server's list: its process died) before the sweeper enqueues a rescue task for it,
	// instead of waiting for asynq's own recovery (1-2 minutes). It must exceed asynq's server
	// heartbeat (5 s), which is how old a live server's list of running tasks can be. Default 15s.
	OrphanGrace time.Duration
	// FreshGrace is how long a job created and never tried or deferred may be without a task
	// before the sweeper enqueues one: its first delivery may be running in the serve process
	// that created it (Handoff), and a second task would take a second limiter slot for it. It
	// must exceed the longest a delivery waits for its slot before the attempt starts (the
	// executor's MaxInlineWait). It is measured on Postgres's clock, as the attempt leases are
	// (jobs.Unfinished). Zero: no grace.
	FreshGrace time.Duration
	// PassJobs is how many unfinished jobs one pass checks when it finds every task in place; the
	// next pass goes on from there, so with a large backlog a round of the whole table spans
	// several passes and a pass's cost does not grow with the backlog. A pass that finds a job
	// without its task (Redis lost data) goes round the whole table. Default 5,000.
	PassJobs int
	// StatementTimeout bounds each of a pass's statements in Postgres (a page of the walk for
	// missing tasks is one): a pass whose connection falls silent (a partition, a failover behind
	// a moved address) fails after it, and the sweeper lock is given up and tried for again one
	// Interval later, instead of the pass hanging until TCP gives up (hours) while this process
	// keeps the lock and no process sweeps. Default DefaultSweepStatementTimeout.
	StatementTimeout time.Duration
	Logger           *slog.Logger
	Metrics          *Metrics
	// LeaderGauge is 1 while this process leads the sweeper, 0 otherwise (llmq_leader; see
	// leader.Metrics.Duty). Nil: none.
	LeaderGauge prometheus.Gauge
	Now         func() time.Time
}

// DefaultSweepStatementTimeout is SweeperConfig.StatementTimeout's default: far above what a
// page of 500 rows read in index order takes on a loaded server, far below TCP's own give-up.
const DefaultSweepStatementTimeout = 30 * time.Second

// Sweeper re-enqueues every non-terminal job whose asynq task is missing: after Redis lost data (a
// restart without persistence, a flush) or after an API process died between commit and enqueue; a
// task asynq holds archived or completed counts as missing (Postgres wins: it is replaced), a
// waiting rescue task as the job's task; and it rescues the jobs whose task a dead worker process
// left active (see SweeperConfig.OrphanGrace). One process at a time sweeps, elected with a
// Postgres advisory lock. Duplicate deliveries are harmless: the attempt lease lets one call at a
// time go. While every task is in place a pass checks SweeperConfig.PassJobs jobs and the next goes
// on from there, so a large backlog is covered over several passes at a bounded cost per pass.
type Sweeper struct {
	cfg SweeperConfig
	// suspects maps the jobs whose task looked orphaned to when it first did, and after is the
	// last job the previous walk for missing tasks checked ("": it reached the end). Used by
	// SweepOnce only: one sweep at a time.
	suspects map[string]time.Time
	after    string
}

// NewSweeper returns a Sweeper; zero config fields take their defaults.
func NewSweeper(cfg SweeperConfig) *Sweeper {
	if cfg.Interval == 0 {
		cfg.Interval = 10 * time.Second
	}
	if cfg.OrphanGrace == 0 {
		cfg.OrphanGrace = 15 * time.Second
	}
	if cfg.PassJobs <= 0 {
		cfg.PassJobs = 5000
	}
	if cfg.StatementTimeout <= 0 {
		cfg.StatementTimeout = DefaultSweepStatementTimeout
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Sweeper{cfg: cfg}
}

// Run sweeps every Interval while this process holds the leader lock, and keeps trying to take
// the lock otherwise. It returns when ctx ends.
//
// The first sweep comes one Interval after the start, not at once: a pass reads every unfinished
// job, and a process starting into a backlog (a deploy, a restart after an outage) would spend
// its first second on that pass instead of the jobs (backlog bench: the first 1,000 of 20,000
// queued jobs drained at 0.76 × the rate of a 1,000-job backlog with the pass at start, 1.08
// without it). Lost tasks are re-enqueued one Interval later than before, at worst.
//
// The failures of the tries to lead and of the passes are logged once a run of them (see
// logstreak.New), each apart: while Postgres or Redis is away every try or pass fails, every
// Interval, in every worker, and a line each buried the rest of the log.
func (s *Sweeper) Run(ctx context.Context) error {
	passes := logstreak.New(ctx, s.cfg.Logger, "sweep pass")
	lead := func(ctx context.Context) error { return s.lead(ctx, passes) }
	leader.Run(ctx, s.cfg.Store.Pool(), sweeperLockKey, s.cfg.Interval, s.cfg.LeaderGauge, lead,
		logstreak.New(ctx, s.cfg.Logger, "sweeper leadership"))
	return nil
}

// lead sweeps at once and then every Interval while this process holds the sweeper's leader
// lock (see leader.Lead), telling report each pass's outcome. A failed pass gives the lock up;
// its error goes to report, not to the leadership's report, which every try's lead clears (a
// run of failed passes, a lead each, would be logged a line a pass again).
func (s *Sweeper) lead(ctx context.Context, report func(error)) error {
	ticker := time.NewTicker(s.cfg.Interval)
	defer ticker.Stop()
	for {
		n, err := s.SweepOnce(ctx)
		report(err)
		if err != nil {
			return nil
		}
		if n > 0 {
			s.cfg.Logger.WarnContext(ctx, "re-enqueued jobs whose task was missing", "count", n)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-ticker.C:
		}
	}
}

// SweepOnce rescues the jobs whose task has looked orphaned for OrphanGrace (active in asynq, on
// no live worker server) and enqueues the non-terminal jobs whose task is missing. It returns how
// many tasks it enqueued. Orphans are looked for among asynq's active tasks, so finding them
// costs what the tasks in flight do, whatever the backlog; missing tasks are looked for by
// walking the unfinished jobs (see reenqueueMissing). Each of its statements in Postgres has
// StatementTimeout (a silent connection fails the pass; Redis's calls are bounded by the
// client's socket timeouts). A pass that succeeds is dated in the metrics
// (llmq_sweeper_last_success_timestamp_seconds); one that fails, but for ctx's end, is counted
// by the store that failed it (llmq_sweeper_pass_failures_total).
func (s *Sweeper) SweepOnce(ctx context.Context) (int, error) {
	n, err := s.sweepOnce(ctx)
	switch {
	case err == nil:
	case ctx.Err() != nil: // shutting down, or the lead lost: not the stores' failure
	case errors.As(err, new(postgresError)):
		s.cfg.Metrics.sweepFailed(storePostgres)
	default:
		s.cfg.Metrics.sweepFailed(storeRedis)
	}
	return n, err
}

// The stores a sweep may fail on (llmq_sweeper_pass_failures_total's label).
const (
	storePostgres = "postgres"
	storeRedis    = "redis"
)

// postgresError marks an error of a sweep's statement in Postgres; a sweep's other errors are
// Redis's (asynq's, the enqueuer's, the task lookups').
type postgresError struct{ error }

func (e postgresError) Unwrap() error { return e.error }

// inPostgres marks err (nil stays nil) as a failure of Postgres (postgresError).
func inPostgres(err error) error {
	if err == nil {
		return nil
	}
	return postgresError{err}
}

func (s *Sweeper) sweepOnce(ctx context.Context) (int, error) {
	now := s.cfg.Now()
	sctx, cancel := context.WithTimeout(ctx, s.cfg.StatementTimeout)
	err := s.cfg.Store.PruneWatches(sctx)
	cancel()
	if err != nil {
		return 0, inPostgres(err)
	}
	rescued, err := s.rescueOrphans(ctx, now)
	if err != nil {
		return rescued, err
	}
	enqueued, err := s.reenqueueMissing(ctx)
	if err == nil {
		s.cfg.Metrics.sweepSucceeded(now)
	}
	return rescued + enqueued, err
}

// rescueOrphans enqueues a rescue task for each non-terminal job whose task is active in asynq
// but on no live worker server's list, once it has looked so for OrphanGrace, unless a live
// attempt lease holds the job (its delivery is alive somewhere). It returns how many it rescued.
//
// A low job's stuck due task (its deferred delivery) is rescued on the main queue, where the
// due task waited: on the low queue the rescue would wait behind the low backlog, and its
// deferral would end it (the stuck task holds the job's due-task ID, see Mux), leaving the job
// to asynq's recoverer, 1-2 minutes after the worker died. On the main queue a deferral is the
// rescue's own retry.
func (s *Sweeper) rescueOrphans(ctx context.Context, now time.Time) (int, error) {
	live, err := s.liveTasks()
	if err != nil {
		return 0, err
	}
	var ids []string
	stuckDue := map[string]bool{}
	for _, queue := range s.cfg.Enqueuer.queues.All() {
		active, err := s.cfg.Redis.LRange(ctx, asynqActiveKey(queue), 0, -1).Result()
		if err != nil {
			return 0, fmt.Errorf("list active tasks of %s: %w", queue, err)
		}
		for _, id := range active {
			if live[id] || strings.HasSuffix(id, rescueSuffix) {
				continue
			}
			jobID, due := strings.CutSuffix(id, dueSuffix)
			ids = append(ids, jobID)
			stuckDue[jobID] = stuckDue[jobID] || due
		}
	}
	sctx, cancel := context.WithTimeout(ctx, s.cfg.StatementTimeout)
	candidates, err := s.cfg.Store.UnfinishedByID(sctx, ids)
	cancel()
	if err != nil {
		return 0, inPostgres(err)
	}
	suspects := map[string]time.Time{}
	rescued := 0
	for _, u := range candidates {
		if u.Leased() {
			continue
		}
		since, ok := s.suspects[u.ID]
		if !ok {
			since = now
		}
		if now.Sub(since) < s.cfg.OrphanGrace {
			suspects[u.ID] = since
			continue
		}
		queue := s.cfg.Enqueuer.queues.For(u.Priority)
		if stuckDue[u.ID] {
			queue = s.cfg.Enqueuer.queues.Due()
		}
		if err := s.cfg.Enqueuer.enqueueRescue(ctx, u.ID, queue); err != nil {
			return rescued, err
		}
		rescued++
		s.cfg.Metrics.sweptOne()
	}
	s.suspects = suspects
	return rescued, nil
}

// reenqueueMissing enqueues the non-terminal jobs that have no task (or an archived or
// completed one, which it deletes first), walking them in ID order from where the last pass
// stopped. It stops after PassJobs jobs when every task it saw was in place
// (the next pass goes on from there, and the one after the end starts over); once one was
// missing it goes on round the whole table, back to where it began, so that recovery from a
// Redis flush takes one pass. It returns how many it enqueued.
func (s *Sweeper) reenqueueMissing(ctx context.Context) (int, error) {
	page := min(500, s.cfg.PassJobs)
	from := s.after
	enqueued, checked := 0, 0
	after, wrapped := from, false
	for {
		sctx, cancel := context.WithTimeout(ctx, s.cfg.StatementTimeout)
		batch, err := s.cfg.Store.ListUnfinished(sctx, after, page)
		cancel()
		if err != nil {
			return enqueued, inPostgres(err)
		}
		full := len(batch) == page
		if wrapped {
			// The second lap stops where the pass began: the jobs from there on were checked.
			if k := slices.IndexFunc(batch, func(u jobs.Unfinished) bool { return u.ID > from }); k >= 0 {
				batch, full = batch[:k], false
			}
		}
		states, err := s.taskStates(ctx, batch)
		if err != nil {
			return enqueued, err
		}
		for i, u := range batch {
			after = u.ID
			switch states[i] {
			case "":
				if u.Fresh(s.cfg.FreshGrace) {
					continue // perhaps a Handoff's; a pass after the grace enqueues it
				}
			case taskStateArchived, taskStateCompleted:
				// asynq keeps the task but never runs it again, and refuses another of its ID:
				// Postgres says the job waits, so the task is replaced.
				if err := s.dropEnded(u.ID); err != nil {
					return enqueued, err
				}
			default:
				continue // in place (or leased, or active: see rescueOrphans)
			}
			var at time.Time
			if u.NextAttemptAt != nil {
				at = *u.NextAttemptAt
			}
			if err := s.cfg.Enqueuer.Enqueue(ctx, u.ID, u.Priority, at); err != nil {
				return enqueued, err
			}
			enqueued++
			s.cfg.Metrics.sweptOne()
		}
		checked += len(batch)
		switch {
		case !full && enqueued > 0 && from != "" && !wrapped:
			// Tasks were missing (Redis lost data): the jobs before where this pass began are
			// checked too.
			after, wrapped = "", true
			continue
		case !full:
			after = "" // a whole lap is done: the next pass starts over
		case checked < s.cfg.PassJobs || enqueued > 0:
			continue
		}
		s.after = after
		return enqueued, nil
	}
}

// The states (asynq's task hash "state" field) of a task asynq keeps but will not run again.
const (
	taskStateArchived  = "archived"
	taskStateCompleted = "completed"
)

// dropEnded deletes the job's tasks that asynq holds archived or completed, so that the job's
// task can be enqueued again.
func (s *Sweeper) dropEnded(id string) error {
	for _, task := range s.cfg.Enqueuer.queues.tasksOf(id) {
		info, err := s.cfg.Inspector.GetTaskInfo(task.queue, task.id)
		if taskAbsent(err) {
			continue
		}
		if err != nil {
			return fmt.Errorf("look up task %s: %w", task.id, err)
		}
		if info.State != asynq.TaskStateArchived && info.State != asynq.TaskStateCompleted {
			continue
		}
		if err := s.cfg.Inspector.DeleteTask(task.queue, task.id); err != nil && !taskAbsent(err) {
			return fmt.Errorf("delete task %s: %w", task.id, err)
		}
	}
	return nil
}

// taskLeased marks, in taskStates' answer, a job whose attempt holds a live lease (not looked up).
const taskLeased = "leased"

// taskStates returns, for each job of batch, the state of its asynq task as asynq stores it
// ("pending", "active", "scheduled", "retry", ...; "" when there is none): a low job's due task's
// when it has one (see Mux), else its task's on its priority's queue, read in one pipelined round
// trip, else its rescue task's (see rescueStates); or taskLeased for a running job whose attempt's
// lease is live (its delivery renews it: re-enqueueing it would only make a duplicate wait).
func (s *Sweeper) taskStates(ctx context.Context, batch []jobs.Unfinished) ([]string, error) {
	out := make([]string, len(batch))
	type lookup struct{ due, own *redis.StringCmd }
	cmds := make([]lookup, len(batch))
	q := s.cfg.Enqueuer.queues
	pipe := s.cfg.Redis.Pipeline()
	for i, u := range batch {
		if u.Leased() {
			out[i] = taskLeased
			continue
		}
		if u.Priority == jobs.PriorityLow { // only a low job's deferrals are due tasks
			cmds[i].due = pipe.HGet(ctx, asynqTaskKey(q.Due(), u.ID+dueSuffix), "state")
		}
		cmds[i].own = pipe.HGet(ctx, asynqTaskKey(q.For(u.Priority), u.ID), "state")
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return nil, fmt.Errorf("look up tasks: %w", err)
	}
	for i, c := range cmds {
		for _, cmd := range []*redis.StringCmd{c.due, c.own} {
			if cmd == nil {
				continue
			}
			v, err := cmd.Result()
			if err != nil && !errors.Is(err, redis.Nil) {
				return nil, fmt.Errorf("look up task %s: %w", batch[i].ID, err)
			}
			if v != "" {
				out[i] = v
				break
			}
		}
	}
	return out, s.rescueStates(ctx, batch, out)
}

// rescueStates fills in, for each job of batch that taskStates found without a task, the state of
// a rescue task that carries it (see Enqueuer.EnqueueRescue: a dead job retried while its task
// was active runs under one), read in one more pipelined round trip, only when some job had no
// task. Only a waiting rescue (pending, scheduled, retry) counts: an archived one never runs,
// and an active one may be an orphan, which rescueOrphans leaves alone (it rescues the job's
// own task): once the job's lease has run out, the walk enqueues the job's task, as before
// rescue tasks carried jobs.
func (s *Sweeper) rescueStates(ctx context.Context, batch []jobs.Unfinished, out []string) error {
	q := s.cfg.Enqueuer.queues
	var missing []int
	var cmds [][]*redis.StringCmd
	pipe := s.cfg.Redis.Pipeline()
	for i, u := range batch {
		if out[i] != "" {
			continue
		}
		missing = append(missing, i)
		// A low job's rescue waits on the main queue when its due task was the stuck one.
		queues := []string{q.For(u.Priority)}
		if u.Priority == jobs.PriorityLow {
			queues = append(queues, q.Due())
		}
		var c []*redis.StringCmd
		for _, queue := range queues {
			c = append(c, pipe.HGet(ctx, asynqTaskKey(queue, u.ID+rescueSuffix), "state"))
		}
		cmds = append(cmds, c)
	}
	if len(missing) == 0 {
		return nil
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return fmt.Errorf("look up rescue tasks: %w", err)
	}
	for k, i := range missing {
		for _, cmd := range cmds[k] {
			v, err := cmd.Result()
			if err != nil && !errors.Is(err, redis.Nil) {
				return fmt.Errorf("look up the rescue task of %s: %w", batch[i].ID, err)
			}
			if v == "pending" || v == "scheduled" || v == "retry" {
				out[i] = v
				break
			}
		}
	}
	return nil
}

// asynqTaskKey is the hash in which asynq v0.26 keeps a task (its "state" field among others):
// base.TaskKey, which asynq does not export. TestSweeper_RespectsLease and the Redis-loss tests
// fail if a new asynq version moves it.
func asynqTaskKey(queue, id string) string { return "asynq:{" + queue + "}:t:" + id }

// asynqActiveKey is the list of the IDs of the tasks asynq v0.26 has handed to a worker
// (base.ActiveKey). TestSweeper_RescuesOrphans and TestChaos_SIGKILLedWorkerProcess fail if a new
// asynq version moves it.
func asynqActiveKey(queue string) string { return "asynq:{" + queue + "}:active" }

// liveTasks returns the IDs of the tasks that live asynq servers (their heartbeat is at most
// 10 s old) report running.
func (s *Sweeper) liveTasks() (map[string]bool, error) {
	servers, err := s.cfg.Inspector.Servers()
	if err != nil {
		return nil, fmt.Errorf("list worker servers: %w", err)
	}
	live := map[string]bool{}
	for _, srv := range servers {
		for _, w := range srv.ActiveWorkers {
			if s.cfg.Enqueuer.queues.contains(w.Queue) {
				live[w.TaskID] = true
			}
		}
	}
	return live, nil
}
