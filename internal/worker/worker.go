// Package worker wires a worker process: upstreams from the config, the executor on dispatch's
// asynq server, the sweeper, and the maintenance passes (deadlines, retention). cmd/worker is its
// thin main; tests and benchmarks run it in-process.
package worker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/hibiken/asynq"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/llmq/llmq/internal/alert"
	"github.com/llmq/llmq/internal/backlog"
	"github.com/llmq/llmq/internal/batchlane"
	"github.com/llmq/llmq/internal/breaker"
	"github.com/llmq/llmq/internal/config"
	"github.com/llmq/llmq/internal/credpause"
	"github.com/llmq/llmq/internal/deltastream"
	"github.com/llmq/llmq/internal/dispatch"
	"github.com/llmq/llmq/internal/estimator"
	"github.com/llmq/llmq/internal/executor"
	"github.com/llmq/llmq/internal/jobs"
	"github.com/llmq/llmq/internal/leader"
	"github.com/llmq/llmq/internal/limiter"
	"github.com/llmq/llmq/internal/llm"
	"github.com/llmq/llmq/internal/logstreak"
	"github.com/llmq/llmq/internal/maintenance"
	"github.com/llmq/llmq/internal/redisscript"
	"github.com/llmq/llmq/internal/retrypolicy"
	"github.com/llmq/llmq/internal/tenant"
)

// Options are the in-process knobs a config file does not carry.
type Options struct {
	// Logger receives the worker's logs. Default discards.
	Logger *slog.Logger
	// Registerer receives the worker's metrics. Default: none.
	Registerer prometheus.Registerer
	// HTTPClient is used for provider calls. Default: llm's default client.
	HTTPClient *http.Client
	// RedisPrefix starts the limiter's and alerter's Redis keys. Default "llmq:"; tests isolate
	// themselves with redistest.Prefix.
	RedisPrefix string
	// Store is the job store, shared with the API of the same process (llmq serve) so that
	// both send their statements through one batcher. Default: a store of its own on the pool.
	Store *jobs.Store
	// PauseRefreshInterval is how often the worker reads each credential's pause state from
	// Redis into llmq_limiter_paused, so that the gauge follows a pause or resume made by
	// another process (ctl credentials resume) on an idle credential. Default 15s.
	PauseRefreshInterval time.Duration
	// Handoff builds a Handoff (see Worker.Handoff) for the API of the same process (llmq
	// serve) to hand its new jobs to. Default: none.
	Handoff bool
	// ShutdownTimeout is how long a stopping worker lets its deliveries running finish before it
	// cuts them (their jobs go back to the queue), its Handoff's too. Default
	// dispatch.DefaultShutdownTimeout; tests whose calls outlast them shorten it rather than wait.
	ShutdownTimeout time.Duration
	// OrphanGrace is how long the sweeper lets a job's task look orphaned (its worker process
	// died) before it rescues the job (dispatch.SweeperConfig.OrphanGrace, which must exceed
	// asynq's 5 s server heartbeat). Default the sweeper's, 15s; tests that kill a worker
	// process shorten it rather than wait.
	OrphanGrace time.Duration
	// LeaseRenewInterval is how often a running attempt renews its job's lease
	// (executor.Config.LeaseRenewInterval). Default executor.DefaultLeaseRenewInterval; tests
	// that must tell a cancel's abort from a renewal's set it beyond their deadline.
	LeaseRenewInterval time.Duration
}

// Worker is one worker process's moving parts.
type Worker struct {
	cfg      *config.Config
	opts     Options
	pool     *pgxpool.Pool
	redis    asynq.RedisConnOpt
	server   *dispatch.Server
	executor *executor.Executor
	handoff  *dispatch.Handoff // nil unless Options.Handoff
	sweeper  *dispatch.Sweeper
	maint    *maintenance.Maintainer
	batcher  *batchlane.Batcher // nil: no credential has a batch lane, and no batch-lane work waited at New
	breaker  *breaker.Breaker
	// alerter raises the executor's and the batcher's alerts; Run waits for its webhook posts.
	alerter  *alert.Alerter
	client   *asynq.Client
	insp     *asynq.Inspector
	enqueuer *dispatch.Enqueuer
	rdb      redis.UniversalClient
	// gates are the credentials' limiter gates, whose pause state Run refreshes.
	gates []*limiter.Gate
	// circuits are the credentials' breakers, whose state (the gauge) Run refreshes.
	circuits []*breaker.Circuit
	// pauses keeps the credentials' pauses in Postgres; refreshPauses restores one Redis lost.
	pauses *credpause.Store
}

// New connects to the stores (the database must be migrated) and builds the worker. On an
// error nothing it opened stays open.
func New(ctx context.Context, cfg *config.Config, pool *pgxpool.Pool, opts Options) (*Worker, error) {
	opts = opts.withDefaults()
	redisOpt, err := dispatch.RedisConnOpt(cfg.RedisURL)
	if err != nil {
		return nil, err
	}
	w := &Worker{cfg: cfg, opts: opts, pool: pool, redis: redisOpt, rdb: dispatch.NewRedisClient(redisOpt)}
	if err := w.build(ctx, newMetrics(opts.Registerer)); err != nil {
		return nil, errors.Join(err, w.close())
	}
	return w, nil
}

// withDefaults fills the options left zero.
func (o Options) withDefaults() Options {
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.PauseRefreshInterval == 0 {
		o.PauseRefreshInterval = 15 * time.Second
	}
	if o.RedisPrefix == "" {
		// The limiter, the breaker and the alerter default to it on their own; the credential
		// tags the console reads (publishCredentialTags) need it here.
		o.RedisPrefix = redisscript.DefaultPrefix
	}
	return o
}

// metrics are the worker's metric sets; all nil without a Registerer.
type metrics struct {
	executor    *executor.Metrics
	dispatch    *dispatch.Metrics
	limiter     *limiter.Metrics
	breaker     *breaker.Metrics
	estimator   *estimator.Metrics
	maintenance *maintenance.Metrics
	alert       *alert.Metrics
	backlog     *backlog.Metrics
	leader      *leader.Metrics
}

func newMetrics(reg prometheus.Registerer) metrics {
	if reg == nil {
		return metrics{}
	}
	return metrics{executor: executor.NewMetrics(reg), dispatch: dispatch.NewMetrics(reg), limiter: limiter.NewMetrics(reg),
		breaker: breaker.NewMetrics(reg), estimator: estimator.NewMetrics(reg), maintenance: maintenance.NewMetrics(reg),
		alert: alert.NewMetrics(reg), backlog: backlog.NewMetrics(reg), leader: leader.NewMetrics(reg)}
}

// build makes the worker's parts, in the order they depend on each other: the shared admission
// state (limiter, breaker), the upstreams, the executor, then the asynq side (sweeper,
// maintenance, batcher, server).
func (w *Worker) build(ctx context.Context, m metrics) error {
	cfg, opts := w.cfg, w.opts
	lim, err := limiter.New(w.rdb, &limiter.Config{Prefix: opts.RedisPrefix, Metrics: m.limiter, TokenMinute: cfg.Worker.TokenMinute,
		PhaseMargin:   cfg.Worker.PhaseMargin,
		MaxRetryAfter: cfg.Retry.MaxRetryAfter, Fairness: limiter.Fairness{MinShareNormal: cfg.Fairness.MinShare.Normal,
			MinShareLow: cfg.Fairness.MinShare.Low, Horizon: cfg.Fairness.Horizon}})
	if err != nil {
		return err
	}
	successMemory := time.Duration(0) // the breaker's default: the cold-start cap is on
	if !cfg.Breaker.ColdStart() {
		successMemory = -1
	}
	// The breaker's calls of concurrent jobs share round trips. The limiter and asynq keep a
	// plain client: through the autopipeliner the limiter's learned token limits paced worse, and
	// asynq's dequeues measured slower (docs/decisions.md).
	if w.breaker, err = breaker.New(dispatch.AutoPipelined(w.rdb, 1), &breaker.Config{Prefix: opts.RedisPrefix,
		Threshold: cfg.Breaker.Threshold, Cooldown: cfg.Breaker.Cooldown, MaxCooldown: cfg.Breaker.MaxCooldown,
		ProbeTimeout: ProbeTimeout(cfg.Credentials), SuccessMemory: successMemory, Metrics: m.breaker}); err != nil {
		return err
	}
	upstreams, err := w.newUpstreams(lim, m.limiter)
	if err != nil {
		return err
	}
	policy := retrypolicy.New(&retrypolicy.Config{BaseDelay: cfg.Retry.BaseDelay, MaxDelay: cfg.Retry.MaxDelay,
		MaxRetryAfter: cfg.Retry.MaxRetryAfter})
	store := w.opts.Store
	if store == nil {
		store = jobs.NewStore(w.pool, nil)
	}
	est, err := estimator.New(&estimator.Config{Metrics: m.estimator})
	if err != nil {
		return err
	}
	weights := tenant.NewWeights(tenant.NewStore(w.pool, nil), nil)
	w.pauses = credpause.NewStore(w.pool, nil)
	w.alerter = alert.New(alert.Config{WebhookURL: cfg.Alerts.WebhookURL, Redis: w.rdb, Prefix: opts.RedisPrefix, Logger: opts.Logger,
		Metrics: m.alert})
	w.executor = executor.New(executor.Config{
		Store: store, Upstreams: upstreams, Policy: policy, Logger: opts.Logger, Metrics: m.executor, Estimator: est,
		Alerter:      w.alerter,
		TenantWeight: weights.Weight, CachedTenantWeight: weights.Cached, Pauses: w.pauses,
		// The API reads the buffers under the default prefix (it has no RedisPrefix): keys are
		// per job, so tests stay apart by job ID.
		Deltas: deltastream.New(deltastream.Config{Redis: w.rdb, Logger: opts.Logger,
			MaxLen: cfg.Streaming.BufferMaxEntries, TTL: cfg.Streaming.BufferTTL, Spacing: cfg.Streaming.DeltaSpacing}),
		BacklogSteps:       cfg.Worker.BacklogSteps,
		LeaseRenewInterval: opts.LeaseRenewInterval,
		Slots:              cfg.Worker.Concurrency, SingleTenant: weights.Single,
	})
	w.client = asynq.NewClient(w.redis)
	w.insp = asynq.NewInspector(w.redis)
	enq := dispatch.NewEnqueuer(w.client, cfg.Worker.Queue, w.rdb)
	w.enqueuer = enq
	if opts.Handoff {
		w.handoff = dispatch.NewHandoff(dispatch.HandoffConfig{Processor: w.executor, Enqueuer: enq, Redis: w.rdb,
			Slots: cfg.Worker.Concurrency, Logger: opts.Logger, Metrics: m.dispatch, ShutdownTimeout: opts.ShutdownTimeout})
	}
	// Every sweeper leaves fresh taskless jobs alone for a while, whether or not its process has
	// a Handoff: the sweeping process is whichever holds the lock.
	w.sweeper = dispatch.NewSweeper(dispatch.SweeperConfig{
		Store: store, Enqueuer: enq, Inspector: w.insp, Redis: w.rdb,
		Interval: cfg.Worker.SweepInterval, OrphanGrace: opts.OrphanGrace, FreshGrace: freshGrace, Logger: opts.Logger, Metrics: m.dispatch,
		LeaderGauge: m.leader.Duty("sweeper"),
	})
	w.maint = maintenance.New(maintenance.Config{
		Store: store, Tasks: dispatch.NewTasks(w.insp, enq),
		Retention: map[jobs.Status]time.Duration{
			jobs.StatusSucceeded: cfg.Retention.Succeeded.Duration(), jobs.StatusFailed: cfg.Retention.Failed.Duration(),
			jobs.StatusCanceled: cfg.Retention.Canceled.Duration(), jobs.StatusDead: cfg.Retention.Dead.Duration(),
		},
		AuditRetention:    cfg.Retention.Audit.Duration(),
		RetentionInterval: cfg.Retention.Interval, Finished: m.executor.Finished, Logger: opts.Logger, Metrics: m.maintenance,
		LeaderGauge: m.leader.Duty("maintenance"),
		Leading: []func(context.Context){
			backlog.New(backlog.Config{Pool: store.Pool(), Logger: opts.Logger, Metrics: m.backlog}).Run,
		},
	})
	if err := w.newBatcher(ctx, m.executor.DeadLettered, m.leader, w.alerter); err != nil {
		return err
	}
	w.server = dispatch.NewServer(w.redis, dispatch.ServerConfig{Queue: cfg.Worker.Queue,
		Concurrency: cfg.Worker.Concurrency, PollInterval: cfg.Worker.PollInterval, Policy: policy, Logger: opts.Logger,
		Metrics: m.dispatch, ShutdownTimeout: opts.ShutdownTimeout})
	return nil
}

// freshGrace is how long the sweeper leaves a fresh job without a task (SweeperConfig.
// FreshGrace): twice the longest wait of a delivery for its slot before the attempt starts.
const freshGrace = 2 * executor.DefaultMaxInlineWait

// Handoff is where the API of the same process hands its new jobs (api.Options.Handoff): their
// first delivery runs here, beside asynq's, in up to worker.concurrency at once. Nil unless
// Options.Handoff was set.
func (w *Worker) Handoff() *dispatch.Handoff { return w.handoff }

// newUpstreams makes each credential's provider adapter, limiter gate and breaker circuit, all
// sharing one answer budget: the bound is on the process's memory. It keeps the gates for
// refreshPauses.
func (w *Worker) newUpstreams(lim *limiter.Limiter, limMetrics *limiter.Metrics) (map[string]executor.Upstream, error) {
	answers, err := llm.NewAnswerBudget(w.cfg.Worker.MaxAnswerBytes, llm.DefaultMaxResponseBytes)
	if err != nil {
		return nil, fmt.Errorf("worker.max_answer_bytes: %w", err)
	}
	if w.opts.Registerer != nil {
		llm.RegisterBudgetMetrics(w.opts.Registerer, answers)
	}
	upstreams := map[string]executor.Upstream{}
	names := make([]string, 0, len(w.cfg.Credentials))
	for _, c := range w.cfg.Credentials {
		names = append(names, c.Name)
		kind, err := llm.ParseKind(c.Provider)
		if err != nil {
			return nil, fmt.Errorf("credential %q: %w", c.Name, err)
		}
		p, err := llm.New(llm.Config{Kind: kind, BaseURL: c.BaseURL, APIKey: c.APIKey(), HTTPClient: w.opts.HTTPClient,
			AnswerBudget: answers})
		if err != nil {
			return nil, fmt.Errorf("credential %q: %w", c.Name, err)
		}
		gate := lim.Gate(c.LimiterID(), c.Name)
		w.gates = append(w.gates, gate)
		circuit := w.breaker.Circuit(c.LimiterID(), c.Name)
		w.circuits = append(w.circuits, circuit)
		up := executor.Upstream{Name: c.Name, Kind: string(kind), Provider: p, AttemptTimeout: c.AttemptTimeout,
			FirstByteTimeout: c.FirstByteTimeout, StallTimeout: c.StallTimeout, Gate: gate, Circuit: circuit,
			PauseProbeInterval: c.PauseProbeInterval}
		if l := c.Limits; l != nil {
			up.Limit = limiter.Limit{Rate: l.RequestsPerSecond, Burst: l.Burst, InputTokensPerMinute: l.InputTokensPerMinute,
				OutputTokensPerMinute: l.OutputTokensPerMinute, TokensPerMinute: l.TokensPerMinute}
		}
		upstreams[c.Name] = up
	}
	limMetrics.InitCredentials(names)
	return upstreams, nil
}

// Close closes the connections of a worker that will not Run (Run closes its own at its end).
func (w *Worker) Close() error { return w.close() }

// close closes what New opened, for the error paths of New (Run closes them after a run).
func (w *Worker) close() error {
	var errs []error
	if w.server != nil {
		w.server.Shutdown() // closes the connections of a server never started, too
	}
	if w.executor != nil {
		w.executor.Stop() // no delivery runs any more: its held-back lines' reports neither
	}
	if w.client != nil {
		errs = append(errs, w.client.Close())
	}
	if w.insp != nil {
		errs = append(errs, w.insp.Close())
	}
	return errors.Join(append(errs, w.rdb.Close())...)
}

// Run processes jobs, sweeps and maintains until ctx ends, then shuts down gracefully.
func (w *Worker) Run(ctx context.Context) error {
	if err := w.server.Start(dispatch.Mux(w.executor, w.enqueuer)); err != nil {
		return fmt.Errorf("start asynq server: %w", err)
	}
	sweepDone, maintDone, listenDone, pausesDone := make(chan error, 1), make(chan error, 1), make(chan struct{}), make(chan struct{})
	go func() { sweepDone <- w.sweeper.Run(ctx) }()
	handoffDone := make(chan error, 1)
	go func() {
		if w.handoff == nil {
			handoffDone <- nil
			return
		}
		// Its deliveries hand their jobs back through the asynq client: it ends before close.
		handoffDone <- w.handoff.Run(ctx)
	}()
	go func() { maintDone <- w.maint.Run(ctx) }()
	batchDone := make(chan error, 1)
	go func() {
		if w.batcher == nil {
			batchDone <- nil
			return
		}
		batchDone <- w.batcher.Run(ctx)
	}()
	go func() {
		defer close(listenDone)
		w.breaker.Listen(ctx)
	}()
	go func() {
		defer close(pausesDone)
		w.refreshPauses(ctx)
	}()
	<-ctx.Done()
	w.server.Shutdown()
	<-listenDone
	<-pausesDone
	err := errors.Join(<-sweepDone, <-maintDone, <-batchDone, <-handoffDone)
	// The last deliveries' alerts are posted before the process goes (each post ends within 10 s).
	// A webhook slower than alertDrainTimeout loses its post, logged here (the alert itself was
	// logged when raised); it does not turn the stop into a failed one.
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), alertDrainTimeout)
	defer cancel()
	if werr := w.alerter.Wait(wctx); werr != nil {
		w.opts.Logger.Warn("alert webhook posts still under way at the stop are abandoned", "error", werr)
	}
	return errors.Join(err, w.close())
}

// alertDrainTimeout bounds how long Run waits at its end for the alerter's webhook posts.
const alertDrainTimeout = 5 * time.Second

// newBatcher builds the batch lane's batcher when a credential's batch lane is enabled, or when
// Postgres holds batch-lane work (batchlane.Pending: the last lane was turned off; none: no
// batcher). It gets every credential: one whose lane is off sends its waiting batch jobs
// online and still polls the batches it has; a paused one (its limiter gate, restored from
// w.pauses) sends none until resumed. Its dead letters are counted by deadLettered (the
// executor's metrics) and alerted by alerter, as the executor's are; its lead is shown in leaders
// (llmq_leader{duty="batch_lane"}).
func (w *Worker) newBatcher(ctx context.Context, deadLettered func(credential, reason string), leaders *leader.Metrics,
	alerter *alert.Alerter) error {
	gates := make(map[string]*limiter.Gate, len(w.gates))
	for _, g := range w.gates {
		gates[g.Name()] = g
	}
	var lanes []batchlane.Lane
	enabled := false
	for _, c := range w.cfg.Credentials {
		enabled = enabled || c.Batch.Enabled
		client, err := batchlane.NewClient(c.Provider, c.BaseURL, c.APIKey(), w.opts.HTTPClient)
		if err != nil {
			return fmt.Errorf("credential %q: %w", c.Name, err)
		}
		lanes = append(lanes, batchlane.Lane{Credential: c.Name, Client: client, Config: c.Batch, Gate: gates[c.Name],
			PauseProbeInterval: c.PauseProbeInterval})
	}
	if !enabled {
		pending, err := batchlane.Pending(ctx, w.pool)
		if err != nil || !pending {
			return err
		}
	}
	var metrics *batchlane.Metrics
	if w.opts.Registerer != nil {
		names := make([]string, len(lanes))
		for i, l := range lanes {
			names[i] = l.Credential
		}
		metrics = batchlane.NewMetrics(w.opts.Registerer, names)
	}
	w.batcher = batchlane.New(batchlane.Config{Pool: w.pool, Lanes: lanes, Logger: w.opts.Logger, Metrics: metrics,
		DeadLettered: deadLettered, Alerter: alerter, Pauses: w.pauses, RolloutGrace: executor.RolloutGrace,
		LeaderGauge: leaders.Duty("batch_lane"),
		Enqueue: func(ctx context.Context, id string, p jobs.Priority) error {
			return w.enqueuer.Enqueue(ctx, id, p, time.Time{})
		}})
	return nil
}

// publishCredentialTags writes each credential's Redis tag under its name
// (redisscript.CredentialIndexKey), for the console, which has no provider keys. refreshPauses
// calls it at start and at every refresh, so a Redis flushed or unreachable at start is repaired,
// and logs its failures (once a run of them): only the console's credentials page needs it.
func (w *Worker) publishCredentialTags(ctx context.Context) error {
	tags := make(map[string]any, len(w.cfg.Credentials))
	for _, c := range w.cfg.Credentials {
		tags[c.Name] = redisscript.CredentialTag(c.LimiterID())
	}
	if len(tags) == 0 {
		return nil
	}
	rctx, cancel := context.WithTimeout(ctx, w.opts.PauseRefreshInterval)
	defer cancel()
	return w.rdb.HSet(rctx, redisscript.CredentialIndexKey(w.opts.RedisPrefix), tags).Err()
}

// refreshPauses reads each credential's pause state (which sets llmq_limiter_paused) at once
// and then every PauseRefreshInterval until ctx ends. The gauge is otherwise only set by this
// worker's own jobs: after a resume by ctl it would stay 1 on an idle credential, and the
// paused alert keep firing; and before a credential's first job it would have no series. A
// state Redis lost (limiter.PauseState.Unknown) is restored from Postgres, so that the gauge of
// an idle credential paused before the loss stays 1; and so is a pause kept in Postgres that
// Redis holds as not paused, the episode never ended there (credpause.Store.Reconcile: a
// failover lost it), at one Postgres read per credential not paused. It reads each breaker's
// state too (which sets llmq_breaker_state), for the same reasons: a breaker another process
// closed stayed open in the gauge of a worker whose jobs had left the credential. The failures of
// each kind of read (pauses, breakers) and of the tags' writes are logged once a run of them
// (see logstreak.New): in an outage of Redis or Postgres every refresh fails, for every
// credential, and a line per credential every refresh in every worker buried the rest of the log.
func (w *Worker) refreshPauses(ctx context.Context) {
	tick := time.NewTicker(w.opts.PauseRefreshInterval)
	defer tick.Stop()
	tags := logstreak.New(ctx, w.opts.Logger, "publish credential tags for the console")
	pauses := logstreak.New(ctx, w.opts.Logger, "refresh credential pause state")
	breakers := logstreak.New(ctx, w.opts.Logger, "refresh credential breaker state")
	for {
		tags(w.publishCredentialTags(ctx))
		var perrs []error
		for _, g := range w.gates {
			rctx, cancel := context.WithTimeout(ctx, w.opts.PauseRefreshInterval)
			ps, err := g.Paused(rctx)
			switch {
			case err == nil && ps.Unknown:
				_, _, err = w.pauses.Restore(rctx, g)
			case err == nil && !ps.Paused:
				// A pause a failover lost (Redis kept its state from before it): nothing else
				// restores it before a spend cap pauses the credential again.
				_, err = w.pauses.Reconcile(rctx, g)
			}
			cancel()
			if err != nil {
				perrs = append(perrs, fmt.Errorf("credential %q: %w", g.Name(), err))
			}
		}
		pauses(errors.Join(perrs...))
		var errs []error
		for _, c := range w.circuits {
			rctx, cancel := context.WithTimeout(ctx, w.opts.PauseRefreshInterval)
			if _, err := c.Status(rctx); err != nil {
				errs = append(errs, err)
			}
			cancel()
		}
		breakers(errors.Join(errs...))
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// ProbeTimeout is how long the breaker lets a probe (or a cold-start slot) go unreported before
// another caller takes its place: longer than any credential's attempt_timeout, so that a call
// still running is not replaced (a job's own longer attempt_timeout, which a submit may set up
// to the job's timeout, can still outlive it). Replaced, a live probe let a second one out
// beside it, and its Failure, of an older generation, was ignored: against a provider whose
// calls hang to the attempt timeout (5m by default, past the breaker's own 2m) the breaker
// stayed half-open with three probes out and never backed off. The price: a probe whose worker
// died holds its place that long.
func ProbeTimeout(creds []config.Credential) time.Duration {
	d := breaker.DefaultProbeTimeout
	for _, c := range creds {
		d = max(d, c.AttemptTimeout+30*time.Second)
	}
	return d
}
