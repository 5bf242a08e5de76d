package batchlane

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/llmq/llmq/internal/alert"
	"github.com/llmq/llmq/internal/config"
	"github.com/llmq/llmq/internal/credpause"
	"github.com/llmq/llmq/internal/jobs"
	"github.com/llmq/llmq/internal/leader"
	"github.com/llmq/llmq/internal/limiter"
	"github.com/llmq/llmq/internal/logstreak"
	"github.com/llmq/llmq/internal/retrypolicy"
)

// DefaultMaxBytes is Lane.MaxBytes's default: OpenAI's cap on a batch's input file, "200 MB"
// (Anthropic's on a create body is 256 MB), read as decimal megabytes: 200,000,000 bytes is
// within the cap whether OpenAI means 10^6 or 2^20 bytes a megabyte (200 << 20 was 9.7 MB past
// it under the first). A larger batch is refused as a whole, and its jobs would all go online
// at the full price.
const DefaultMaxBytes = 200_000_000

// requestOverhead is what a request adds to its body in a batch, at most: its custom_id and
// the JSON around it (OpenAI: method and url too).
const requestOverhead = 128

// lockKey elects the one batching process ("llmqbtch").
const lockKey int64 = 0x6c6c6d7162746368

// Lane is one credential's batch lane: its provider's batch client and its batch settings. A
// lane whose Config.Enabled is false collects nothing (its waiting jobs go online) but still
// sends and polls the batches it has, so that turning a lane off strands no job.
type Lane struct {
	Credential string
	Client     Client
	Config     config.Batch
	// Gate is the credential's limiter gate, whose pause (a spend cap; limiter.Gate.Paused)
	// holds the lane's sends until the credential is resumed. Nil: never held (and a spend cap
	// of the batch API is only alerted).
	Gate *limiter.Gate
	// PauseProbeInterval, when set, lets one send per interval probe the paused credential (the
	// credential's pause_probe_interval, shared with the online lane's probe through Gate): its
	// success resumes the credential. Zero: only an operator resumes it.
	PauseProbeInterval time.Duration
	// MaxBytes bounds a batch's requests: their bodies, as stored, and requestOverhead bytes
	// each. Zero: DefaultMaxBytes.
	MaxBytes int64
}

// Config configures a Batcher.
type Config struct {
	// Pool is the jobs' Postgres (migrated to 016 or later).
	Pool *pgxpool.Pool
	// Lanes are the credentials whose batch lane is enabled.
	Lanes []Lane
	// Enqueue hands a job that leaves the batch lane to the online lane (its asynq task). When it
	// fails the sweeper enqueues the job later: it is an unfinished online job without a task.
	// priority is the job's.
	Enqueue func(ctx context.Context, jobID string, priority jobs.Priority) error
	// Tick is the time between two passes (see Once). Default 1s.
	Tick time.Duration
	// Now is the clock of every decision (fill, poll, deadline). Default time.Now.
	Now    func() time.Time
	Logger *slog.Logger
	// Metrics receives the batch lane's counters; nil records none.
	Metrics *Metrics
	// LeaderGauge is 1 while this process leads the batch lane, 0 otherwise (llmq_leader; see
	// leader.Metrics.Duty). Nil: none.
	LeaderGauge prometheus.Gauge
	// DeadLettered, when set, is told of each job the batcher dead-letters, as the executor
	// counts its own (executor.Metrics.DeadLettered: llmq_dead_letters_total, which the
	// dead-letter alert reads).
	DeadLettered func(credential, reason string)
	// Alerter raises the dead-letter alert (log line and webhook) for the jobs the batcher
	// dead-letters, at most once a minute per credential, as the executor does for retries
	// exhausted online. Nil: none.
	Alerter *alert.Alerter
	// Pauses keeps the credentials' pauses in Postgres: a pause state Redis lost is restored from
	// it before a lane sends (see credpause). Nil: Redis's state alone is read.
	Pauses *credpause.Store
	// RolloutGrace is how long a job waiting for a batch on a credential Lanes lack, created
	// after New, is left for the batcher of a newer config (a rolling deploy that adds the
	// credential; the executor's executor.RolloutGrace). Older jobs on such a credential (it
	// was removed) go online, where the executor moves them to their fallbacks, or
	// dead-letters them.
	RolloutGrace time.Duration
}

// Batcher sends the batch lane's jobs through the providers' batch APIs: it collects waiting
// jobs per credential and model into batches, commits each batch and its jobs in Postgres before
// sending it, polls sent batches with backoff and records each job's result by custom_id (the
// job ID). One process batches at a time (Run elects it with a Postgres advisory lock); Once is
// one pass and is safe to call again after any failure or crash: a committed batch is looked up
// at the provider before it is sent again, so no job is paid for twice by a crash.
type Batcher struct {
	cfg   Config
	store store
	lanes map[string]Lane
	// started is when New ran, on Config.Now (see Config.RolloutGrace).
	started time.Time
	// crashAfterCommit, set by tests only, ends a pass between a batch's commit and its send.
	crashAfterCommit error
	// crashAfterRecord, set by tests only, ends a pass between the recording of an ended
	// batch's results and the batch's close.
	crashAfterRecord error
	// crashAfterClose, set by tests only, ends a pass between its batches' closes and the
	// deletes of their files.
	crashAfterClose error
	// afterUpload, set by tests only, runs between an upload's answer and its record.
	afterUpload func()

	// sweepMu guards sweptAt: when each credential's uploads were last listed (adoptUploads).
	sweepMu sync.Mutex
	sweptAt map[string]time.Time
	// sweepTimeout, set by tests only, replaces uploadSweepTimeout.
	sweepTimeout time.Duration
}

// New returns a Batcher; zero config fields take their defaults.
func New(cfg Config) *Batcher {
	cfg.Tick = cmp.Or(cfg.Tick, time.Second)
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	lanes := map[string]Lane{}
	for _, l := range cfg.Lanes {
		lanes[l.Credential] = l
	}
	return &Batcher{cfg: cfg, store: store{pool: cfg.Pool}, lanes: lanes, started: cfg.Now(), sweptAt: map[string]time.Time{}}
}

// Run makes a pass every Tick while this process leads the batch lane, and keeps trying to lead
// otherwise, until ctx ends. Errors are logged, the first of a run of them only (and the
// success that ends it; see logstreak.New), as the maintenance passes log theirs: during a
// Postgres outage every process would otherwise log one a Tick. A run of failed passes is a
// lead's: while another process led, its passes may have succeeded, and a lead's failures are
// logged by the process that leads (the one whose log LLMQBatchLaneStalled sends you to).
func (b *Batcher) Run(ctx context.Context) error {
	leader.Run(ctx, b.cfg.Pool, lockKey, b.cfg.Tick, b.cfg.LeaderGauge, b.lead,
		logstreak.New(ctx, b.cfg.Logger, "batch lane leadership"))
	return nil
}

// lead makes a pass every Tick until ctx (the lead) ends, logging the first failure of a run of
// them (but that of a pass the lead's end cut).
func (b *Batcher) lead(ctx context.Context) error {
	b.forgetSweeps()
	report := logstreak.New(ctx, b.cfg.Logger, "batch lane pass")
	t := time.NewTicker(b.cfg.Tick)
	defer t.Stop()
	for {
		if err := b.Once(ctx); ctx.Err() == nil {
			report(err)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// Once is one pass: it sends the committed batches (after a crash, looking each up first), polls
// the sent batches that are due and records the results of those that ended, moves the jobs
// whose deadline is near to the online lane, collects the waiting jobs into new batches, and
// deletes the files at the providers that no batch needs any more (see deleteDueFiles). An
// error of one batch does not stop the others; Once returns them joined. A pass without error is
// dated in the metrics (llmq_batch_last_success_timestamp_seconds).
func (b *Batcher) Once(ctx context.Context) error {
	start := b.cfg.Now()
	err := b.pass(ctx)
	if err == nil {
		b.cfg.Metrics.passed(start)
	}
	return err
}

// pass is Once's work.
func (b *Batcher) pass(ctx context.Context) error {
	var errs []error
	open, err := b.store.open(ctx)
	if err != nil {
		return err
	}
	held := heldLanes{}
	defer b.releaseProbes(ctx, held)
	// Before the sends: an upload it records for a batch that a send then finds never became one
	// is released by that send, and deleted at this pass's end.
	errs = append(errs, b.adoptUploads(ctx))
	for _, row := range open {
		lane, ok := b.lanes[row.Credential]
		if !ok {
			continue // a credential no longer configured: its jobs end at their deadline
		}
		switch row.State {
		case "committed":
			if row.NextPollAt != nil && b.cfg.Now().Before(*row.NextPollAt) {
				// Its send is not due (another send's claim, or a failed one's backoff): it reads
				// no pause, so takes no probe it would not send (the online lane's attempts
				// would be refused it while the pass goes on, every pass until the send is due).
				errs = append(errs, b.unsentFallback(ctx, lane, row))
				continue
			}
			if h, err := b.held(ctx, lane, held); h {
				// Sent when the credential is resumed; meanwhile its jobs near their deadline go
				// online, as when a send fails.
				errs = append(errs, err, b.unsentFallback(ctx, lane, row))
				continue
			}
			errs = append(errs, b.send(ctx, lane, row, held))
		case "submitted":
			errs = append(errs, b.poll(ctx, lane, row, held)) // a paused credential's too: it is paid for
		}
	}
	for _, lane := range b.cfg.Lanes {
		errs = append(errs, b.collect(ctx, lane, held))
	}
	errs = append(errs, b.collectUnconfigured(ctx), b.deleteDueFiles(ctx))
	return errors.Join(errs...)
}

// collectUnconfigured sends online the jobs waiting for a batch on a credential Lanes lack (see
// Config.RolloutGrace), as a lane turned off does (batch_state lane_off): no lane would collect
// them, and they waited for their deadline. A job created after New, less than RolloutGrace
// ago, is left for a batcher of a newer config.
func (b *Batcher) collectUnconfigured(ctx context.Context) error {
	configured := make([]string, 0, len(b.lanes))
	for name := range b.lanes {
		configured = append(configured, name)
	}
	creds, err := b.store.unconfigured(ctx, configured)
	if err != nil {
		return err
	}
	now := b.cfg.Now()
	var errs []error
	for _, cred := range creds {
		waiting, err := b.store.waiting(ctx, cred, unconfiguredBatch)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		for _, w := range waiting {
			if w.CreatedAt.After(b.started) && now.Sub(w.CreatedAt) < b.cfg.RolloutGrace {
				continue
			}
			errs = append(errs, b.applyMove(ctx, cred, move{JobID: w.ID, Status: "queued", Lane: "online", BatchState: "lane_off"}))
		}
	}
	return errors.Join(errs...)
}

// unconfiguredBatch is how many jobs of a credential Lanes lack one pass looks at.
const unconfiguredBatch = 500

// heldLanes memoizes, for one pass, whether each credential's sends are held (see held).
type heldLanes map[string]laneHold

// laneHold is one credential's state in a pass: held, or free to send; free while paused when
// probe (the pause's probe, granted for this pass) is granted and not yet spent.
type laneHold struct {
	held  bool
	probe limiter.PauseProbe
}

// held reports whether lane sends nothing this pass: its credential is paused (Lane.Gate; a
// state Redis lost is restored from Config.Pauses first, as the executor does). A paused
// credential's provider refuses the send or, should the cap lift, charges for a batch the
// operator has not resumed: its batches wait for the resume (ctl credentials resume, the online
// lane's pause probe, or the lane's own: with Lane.PauseProbeInterval, the pass's first send of
// the interval's probe, granted as the online lane's is, goes, and its success resumes the
// credential; see send). The pause is read at most once per pass per credential; one that
// cannot be read holds the sends too, and the error is returned once.
func (b *Batcher) held(ctx context.Context, lane Lane, memo heldLanes) (bool, error) {
	if lane.Gate == nil {
		return false, nil
	}
	if h, ok := memo[lane.Credential]; ok {
		return h.held, nil
	}
	ps, err := lane.Gate.Paused(ctx)
	if err == nil && ps.Unknown && b.cfg.Pauses != nil {
		ps, _, err = b.cfg.Pauses.Restore(ctx, lane.Gate)
	}
	if err != nil {
		memo[lane.Credential] = laneHold{held: true}
		return true, fmt.Errorf("read the pause of credential %s (its batches are held): %w", lane.Credential, err)
	}
	h := laneHold{held: ps.Paused}
	if ps.Paused && lane.PauseProbeInterval > 0 {
		probe, err := lane.Gate.TryProbe(ctx, lane.PauseProbeInterval)
		if err != nil {
			memo[lane.Credential] = h
			return true, fmt.Errorf("probe the pause of credential %s (its batches are held): %w", lane.Credential, err)
		}
		if probe.Granted() {
			h = laneHold{probe: probe}
		}
	}
	memo[lane.Credential] = h
	return h.held, nil
}

// releaseProbes gives back the pass's probes that no send spent (its batches found at the
// provider, or emptied, before a send): the next pass may probe at once rather than an
// interval later. It does so also when the pass was canceled (its leader lost the lock, the
// worker stops), on a context without the cancel, as the executor gives back an unsent
// attempt's: else the credential's next probe, the online lane's or the next leader's, waits a
// whole interval.
func (b *Batcher) releaseProbes(ctx context.Context, memo heldLanes) {
	ctx = context.WithoutCancel(ctx)
	for cred, h := range memo {
		if lane, ok := b.lanes[cred]; ok && h.probe.Granted() {
			if err := lane.Gate.ReleaseProbe(ctx, h.probe); err != nil {
				b.cfg.Logger.WarnContext(ctx, "release an unsent pause probe (the next waits its interval)", "credential", cred, "error", err)
			}
		}
	}
}

// probed ends the pass's probe of lane's paused credential, if one is going, after a send was
// tried: accepted (ok), the credential is resumed (Config.Pauses, then Redis); failed, the probe
// is spent and the lane's sends are held for the rest of the pass.
func (b *Batcher) probed(ctx context.Context, lane Lane, memo heldLanes, ok bool) {
	h := memo[lane.Credential]
	if !h.probe.Granted() {
		return
	}
	if !ok {
		memo[lane.Credential] = laneHold{held: true}
		return
	}
	memo[lane.Credential] = laneHold{}
	var err error
	if b.cfg.Pauses != nil {
		_, err = b.cfg.Pauses.Resume(ctx, lane.Gate)
	} else {
		_, err = lane.Gate.Resume(ctx)
	}
	if err != nil {
		b.cfg.Logger.WarnContext(ctx, "resume after a batch probe", "credential", lane.Credential, "error", err)
		return
	}
	b.cfg.Logger.WarnContext(ctx, "credential resumed: the batch lane's pause probe was accepted", "credential", lane.Credential)
}

// spendCap pauses lane's credential after its batch API answered a send with a spend cap (a 429
// without Retry-After, or a spend-cap code: retrypolicy.Classify, as the online lane reads an
// answer), or an ended batch answered a request with a spend-cap code, in Postgres too, and
// alerts once per episode, as the executor does: a key that can no longer pay is sent nothing
// more, batch or online, until it is resumed. The lane's sends are held for the rest of the
// pass. what says what was refused (the batch, or one of its requests).
func (b *Batcher) spendCap(ctx context.Context, lane Lane, memo heldLanes, what, reason string, cause error) error {
	memo[lane.Credential] = laneHold{held: true}
	err := credpause.PauseSpendCap(ctx, credpause.SpendCapParams{Alerter: b.cfg.Alerter,
		Credential: lane.Credential, Gate: lane.Gate, Logger: b.cfg.Logger,
		Message: fmt.Sprintf("the batch API refused %s: %v", what, cause), Reason: reason,
		Store: b.cfg.Pauses})
	if err != nil {
		return fmt.Errorf("pause credential %s after a spend cap: %w", lane.Credential, err)
	}
	return nil
}

// collect puts lane's waiting jobs into batches, per model: a batch goes when it is full (its
// MaxRequestsPerBatch, or its MaxBytes) or when its oldest job has waited MaxWaitToFill. A
// waiting job whose deadline is within OnlineFallback goes online instead. While the credential
// is paused (see held) no batch is made: the jobs keep waiting.
func (b *Batcher) collect(ctx context.Context, lane Lane, held heldLanes) error {
	now := b.cfg.Now()
	waiting, err := b.store.waiting(ctx, lane.Credential, 10*max(lane.Config.MaxRequestsPerBatch, 1))
	if err != nil {
		return err
	}
	byModel := map[string][]waitingJob{}
	var models []string
	var errs []error
	for _, w := range waiting {
		switch {
		case !lane.Config.Enabled:
			errs = append(errs, b.applyMove(ctx, lane.Credential, move{JobID: w.ID, Status: "queued", Lane: "online", BatchState: "lane_off"}))
			continue
		case !now.Before(w.Deadline.Add(-lane.Config.OnlineFallback)):
			errs = append(errs, b.applyMove(ctx, lane.Credential, move{JobID: w.ID, Status: "queued", Lane: "online", BatchState: "deadline_fallback"}))
			continue
		}
		if _, ok := byModel[w.Model]; !ok {
			models = append(models, w.Model)
		}
		byModel[w.Model] = append(byModel[w.Model], w)
	}
	maxBytes := cmp.Or(lane.MaxBytes, DefaultMaxBytes)
	for _, model := range models {
		jobs := byModel[model]
		for len(jobs) > 0 {
			n := fitting(jobs, lane.Config.MaxRequestsPerBatch, maxBytes)
			full := n == lane.Config.MaxRequestsPerBatch || n < len(jobs)
			if !full && now.Sub(jobs[0].CreatedAt) < lane.Config.MaxWaitToFill {
				break // not full, and its oldest job may wait longer
			}
			if h, err := b.held(ctx, lane, held); h {
				return errors.Join(append(errs, err)...)
			}
			ids := make([]string, n)
			for i, j := range jobs[:n] {
				ids[i] = j.ID
			}
			jobs = jobs[n:]
			errs = append(errs, b.commitAndSend(ctx, lane, model, ids, held))
		}
	}
	return errors.Join(errs...)
}

// fitting is how many of jobs, from the first, one batch takes: at most maxRequests, and as many
// as fit in maxBytes (see Lane.MaxBytes), but at least one (a request larger than the cap goes
// alone, to be refused and sent online). A batch that stops short of jobs is full.
func fitting(jobs []waitingJob, maxRequests int, maxBytes int64) int {
	n, size := 0, int64(0)
	for _, j := range jobs[:min(len(jobs), maxRequests)] {
		size += j.Bytes + requestOverhead
		if n > 0 && size > maxBytes {
			break
		}
		n++
	}
	return n
}

// commitAndSend commits a batch of ids and then sends it.
func (b *Batcher) commitAndSend(ctx context.Context, lane Lane, model string, ids []string, held heldLanes) error {
	id := uuid.NewString()
	if _, err := b.store.commit(ctx, id, lane.Credential, model, ids); errors.Is(err, errEmpty) {
		return nil
	} else if err != nil {
		return err
	}
	if b.crashAfterCommit != nil {
		return b.crashAfterCommit
	}
	return b.send(ctx, lane, batchRow{ID: id, Credential: lane.Credential, Model: model, State: "committed"}, held)
}

// sendClaim is how long a send holds its batch against another send (see store.beginSend): past
// the longest a send of a leader that lost its lock goes on (its pass ends at its next lock check,
// one Tick on, abandoning its request; a hung request ends at the batch client's timeout, 5
// minutes by default). A send that ends records its outcome, which ends the claim; one whose
// process died leaves it, and the next leader looks the batch up once it has run out.
const sendClaim = 10 * time.Minute

// send submits committed batch row. When a send of it began before (the process died or the
// call failed without an answer), the provider may hold it already: it is looked up first (by
// the last send's start and size, recorded before it went: see store.resend), and sent again
// only when the provider has none. A send or look-up that failed is tried again after the
// polls' backoff, or the answer's longer Retry-After (retryDelay), not at every pass: a provider
// whose batch API is down or overloaded is not asked once a second (for OpenAI, with the
// batch's file uploaded each time); meanwhile the batch's jobs near their deadline still go
// online. A send claims its batch for
// sendClaim (see store.beginSend): a second leader, while a cut-off one may still be sending it,
// leaves it alone until the claim or the send's outcome ends. A send refused with a spend cap
// pauses the credential (see spendCap) and stays committed, its claim ended, to go once the
// credential is resumed. A send that reached the provider ends the pass's pause probe, if one is
// going (see probed).
func (b *Batcher) send(ctx context.Context, lane Lane, row batchRow, held heldLanes) error {
	if row.NextPollAt != nil && b.cfg.Now().Before(*row.NextPollAt) {
		return b.unsentFallback(ctx, lane, row)
	}
	later := func(err error) error {
		now := b.cfg.Now()
		return b.store.pollLater(ctx, row.ID, now.Add(retryDelay(lane.Config, row.Polls, err, now)))
	}
	now := b.cfg.Now()
	reqs, since, sent, err := b.store.beginSend(ctx, row.ID, now, now.Add(sendClaim))
	if errors.Is(err, errEmpty) {
		return nil // every job ended before the send: nothing to pay for
	}
	if errors.Is(err, errNotDue) {
		// Another send holds it (a leader cut off from its lock may still be sending it), or
		// a failed one's backoff does, read since this pass listed the batch.
		return b.unsentFallback(ctx, lane, row)
	}
	if err != nil {
		return err
	}
	providerID := ""
	if row.SubmitStartedAt != nil {
		taken, err := b.store.providerIDs(ctx, row.Credential, row.ID, since.Add(-findWindow))
		if err != nil {
			return err
		}
		if providerID, err = lane.Client.Find(ctx, row.ID, since, sent, func(id string) bool { return taken[id] }); err != nil {
			return errors.Join(fmt.Errorf("look up batch %s: %w", row.ID, err), b.unsentFallback(ctx, lane, row), later(err))
		}
		if providerID != "" {
			b.cfg.Logger.InfoContext(ctx, "found a batch sent before a restart", "batch", row.ID, "provider_batch_id", providerID)
		}
	}
	if providerID == "" && len(reqs) == 0 {
		// Every job was canceled since an earlier send, which the provider does not hold:
		// nothing to pay for.
		return b.store.ended(ctx, row.ID, "canceled", "")
	}
	if providerID == "" && row.SubmitStartedAt != nil {
		// What the next look-up (should this send's answer be lost) looks for.
		if err := b.store.resend(ctx, row.ID, len(reqs)); err != nil {
			return errors.Join(err, later(err))
		}
	}
	if providerID == "" && row.SubmitStartedAt != nil {
		// No earlier send's upload became a batch (the look-up found none, and the claim keeps
		// any earlier send from landing now): they are deleted without waiting for the close.
		if err := b.store.releaseUploads(ctx, row.ID); err != nil {
			return errors.Join(err, later(err))
		}
	}
	if providerID == "" {
		uploaded := func(file string) error {
			if b.afterUpload != nil {
				b.afterUpload()
			}
			return b.store.recordUpload(ctx, row.ID, row.Credential, file)
		}
		if providerID, err = lane.Client.Submit(ctx, row.ID, reqs, uploaded); err != nil {
			b.probed(ctx, lane, held, false) // a probe whose send failed is spent (it may have reached the provider)
			if d := retrypolicy.Classify(err, b.cfg.Now()); d.Class == retrypolicy.ClassSpendCap {
				// Refused, so not on its way: the claim ends, and the batch goes once resumed.
				return errors.Join(fmt.Errorf("send batch %s: a spend cap: %w", row.ID, err),
					b.spendCap(ctx, lane, held, "batch "+row.ID, d.DeadReason, err), b.store.endClaim(ctx, row.ID),
					b.unsentFallback(ctx, lane, row))
			}
			if se := (*StatusError)(nil); errors.As(err, &se) && !retryableStatus(se.Status) {
				return b.refused(ctx, row, se)
			}
			return errors.Join(fmt.Errorf("send batch %s: %w", row.ID, err), b.unsentFallback(ctx, lane, row), later(err))
		}
		b.probed(ctx, lane, held, true)
	}
	if err := b.store.submitted(ctx, row.ID, providerID, b.cfg.Now().Add(lane.Config.PollInterval)); err != nil {
		return err
	}
	b.cfg.Metrics.batch(row.Credential, "sent")
	return nil
}

// retryDelay is the wait before a batch's call that failed with err (its send or look-up, after
// polls tries; its poll, results download or cancel, after polls-1 polls) is tried again: the
// polls' backoff (pollDelay), or the answer's Retry-After when that is longer (Anthropic's 429
// while the organization's batch queue is full says when it has room; asked sooner, it answers
// 429 again), at most the backoff's cap, 10 × PollInterval, as a longer backoff is.
func retryDelay(c config.Batch, polls int, err error, now time.Time) time.Duration {
	d := pollDelay(c, polls)
	if rd := retrypolicy.Classify(err, now); rd.HasRetryAfter {
		d = max(d, min(rd.RetryAfter, 10*c.PollInterval))
	}
	return d
}

// unsentFallback moves the jobs of a batch whose send failed (it is sent again after a backoff,
// see send) to the online lane when their deadline is within OnlineFallback, so that a provider
// whose batch API is down does not hold them past it. Should the failed send have reached the
// provider, such a job may be paid for twice: the price of its deadline.
func (b *Batcher) unsentFallback(ctx context.Context, lane Lane, row batchRow) error {
	now := b.cfg.Now()
	jobs, err := b.store.jobs(ctx, row.ID)
	if err != nil {
		return err
	}
	var errs []error
	for _, j := range jobs {
		if j.unfinished() && !now.Before(j.Deadline.Add(-lane.Config.OnlineFallback)) {
			ref := row.ID
			errs = append(errs, b.applyMove(ctx, row.Credential, move{JobID: j.ID, Ref: &ref, Status: "queued", Lane: "online",
				BatchState: "deadline_fallback", LastError: map[string]any{"class": "retryable", "type": "deadline_fallback",
					"message": "the job's batch could not be sent before its deadline came near"}}))
		}
	}
	return errors.Join(errs...)
}

// refused handles a batch the provider refused as a whole (a 4xx other than 408, 409, 429: too
// large, a bad key): sending it again would be refused again, so its jobs go to the online lane,
// where each gets its own answer, and the batch ends canceled.
func (b *Batcher) refused(ctx context.Context, row batchRow, se *StatusError) error {
	jobs, err := b.store.jobs(ctx, row.ID)
	if err != nil {
		return err
	}
	msg := "the provider refused the batch: " + se.Error()
	var errs []error
	for _, j := range jobs {
		if !j.unfinished() {
			continue
		}
		ref := row.ID
		errs = append(errs, b.applyMove(ctx, row.Credential, move{JobID: j.ID, Ref: &ref, Status: "queued", Lane: "online", BatchState: "refused",
			LastError: map[string]any{"class": "retryable", "status": se.Status, "type": "batch_refused", "message": msg}}))
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	b.cfg.Metrics.batch(row.Credential, "refused")
	return b.store.ended(ctx, row.ID, "canceled", "refused")
}

// pollDelay is the wait before poll n+1 of a batch: PollInterval doubled per poll, at most ten
// times PollInterval.
func pollDelay(c config.Batch, polls int) time.Duration {
	return doubled(c.PollInterval, polls, 10*c.PollInterval)
}

// doubled is base doubled n times (none for n ≤ 0), at most limit.
func doubled(base time.Duration, n int, limit time.Duration) time.Duration {
	d := base
	for range max(n, 0) {
		if d >= limit {
			break
		}
		d *= 2
	}
	return min(d, limit)
}

// poll handles a sent batch when its poll is due: its jobs near their deadline go online (or
// fail, with no attempt left: deadlineMove); a batch whose jobs have all ended is canceled at the
// provider; otherwise it is polled, and when it ended its results are recorded. The next poll
// comes after the backoff, or when the next of its jobs is to fall back online, whichever is
// first; a pass reads nothing of a batch not due. A poll, results download or cancel that failed
// is tried again after the backoff or, when longer, the answer's Retry-After (retryDelay, at
// most the backoff's cap), unless a job's fallback comes first; a poll before a cancel that was
// answered with a Retry-After waits it too, rather than send the cancel into the same refusal.
// A spend cap's pause Redis refused while recording its results waits the backoff too
// (afterRecord).
func (b *Batcher) poll(ctx context.Context, lane Lane, row batchRow, held heldLanes) error {
	now := b.cfg.Now()
	if row.NextPollAt != nil && now.Before(*row.NextPollAt) {
		return nil
	}
	jobs, err := b.store.jobs(ctx, row.ID)
	if err != nil {
		return err
	}
	live, next := 0, now.Add(pollDelay(lane.Config, row.Polls+1))
	var fallbackAt *time.Time // the earliest fallback of a job still waiting
	var due []batchJob        // the jobs at their fallback
	for _, j := range jobs {
		if !j.unfinished() {
			continue
		}
		fallback := j.Deadline.Add(-lane.Config.OnlineFallback)
		if !now.Before(fallback) {
			due = append(due, j)
			continue
		}
		live++
		if fallbackAt == nil || fallback.Before(*fallbackAt) {
			fallbackAt = &fallback
		}
	}
	if fallbackAt != nil && fallbackAt.Before(next) {
		next = *fallbackAt
	}
	// later records a failed call (err): tried again after retryDelay, or at the next fallback.
	later := func(err error) error {
		at := b.cfg.Now()
		at = at.Add(retryDelay(lane.Config, row.Polls+1, err, at))
		if fallbackAt != nil && fallbackAt.Before(at) {
			at = *fallbackAt
		}
		return errors.Join(err, b.store.pollLater(ctx, row.ID, at))
	}
	if live == 0 && len(due) == 0 {
		return b.closeIdle(ctx, lane, row, jobs, held, later)
	}
	// The batch is polled before its jobs at their fallback go online: one that ended since
	// the last poll has their answers, paid for, which record stores as it does the others'.
	fallBack := func() error {
		for _, j := range due {
			if err := b.applyMove(ctx, row.Credential, b.deadlineMove(row, j, now)); err != nil {
				return err
			}
		}
		return nil
	}
	st, err := lane.Client.Poll(ctx, *row.ProviderID)
	if len(due) > 0 && (err != nil || !st.Ended || st.Failed) {
		if err := fallBack(); err != nil {
			return err
		}
		if live == 0 {
			return b.closeIdle(ctx, lane, row, jobs, held, later)
		}
		due = nil
	}
	if se := (*StatusError)(nil); errors.As(err, &se) && se.Status == http.StatusNotFound {
		// The provider no longer knows the batch (deleted, or gone with an account): its jobs
		// have no result and go round again, as expired ones do.
		if err := b.record(ctx, lane, row, jobs, nil, noLine, "not_found", held); err != nil {
			return err
		}
		b.cfg.Metrics.batch(row.Credential, "lost")
		return b.store.ended(ctx, row.ID, "ended", "not_found")
	}
	if err != nil {
		return later(err)
	}
	if !st.Ended {
		return b.store.polled(ctx, row.ID, st.Provider, next)
	}
	if st.Failed {
		// None of its requests ran, and it has no results: its jobs go online, as a refused
		// batch's do, with the provider's reason.
		if err := b.record(ctx, lane, row, jobs, nil, Result{Kind: Failed, ErrorType: st.ErrorType, Message: st.Message},
			st.Provider, held); err != nil {
			return afterRecord(err, later)
		}
		return b.closeEnded(ctx, row, st)
	}
	results, err := lane.Client.Results(ctx, *row.ProviderID)
	if err != nil {
		// The jobs at their fallback go online: the results may not be read before their deadline.
		return errors.Join(fallBack(), later(err))
	}
	if err := b.record(ctx, lane, row, jobs, results, noLine, st.Provider, held); err != nil {
		return afterRecord(err, later)
	}
	if b.crashAfterRecord != nil {
		return b.crashAfterRecord
	}
	return b.closeEnded(ctx, row, st)
}

// closeIdle handles sent batch row when none of its jobs waits for it any more (jobs, read
// by this pass: those it moved online still show unfinished). One that has ended at the provider
// (its results were recorded by a leader that died before closing it, or it ended as its last
// jobs left, or the cancel below ended it) is closed (see closeAs): as ended, or canceled once
// its cancel was accepted (provider state canceling, in the row or in the poll's answer: the
// batcher that canceled it may have died before recording it), its files deleted either way;
// its results are read first, for the usage of its canceled jobs' answers (see record: the
// provider charged for them). One the provider no longer knows (404) is closed, and logged (see
// closeLost): canceled after a cancel it accepted, else lost. Else it is canceled at the
// provider, once, to stop paying for what is left of it, and polled on (the provider takes a
// while to end a canceled batch: OpenAI's cancelling lasts up to 10 minutes, and writes the
// output and error files of what it ran) until it ended. later records a failed call. A poll
// that fails leaves that to the cancel's answer, but one answered with a Retry-After waits it (a
// cancel now would be refused the same).
func (b *Batcher) closeIdle(ctx context.Context, lane Lane, row batchRow, jobs []batchJob,
	held heldLanes, later func(error) error) error {
	st, err := lane.Client.Poll(ctx, *row.ProviderID)
	asked := row.ProviderState != nil && cancelAsked(*row.ProviderState) ||
		err == nil && cancelAsked(st.Provider)
	if err == nil && st.Ended {
		if !st.Failed {
			results, err := lane.Client.Results(ctx, *row.ProviderID)
			if err != nil {
				return later(err)
			}
			left := slices.DeleteFunc(slices.Clone(jobs), batchJob.unfinished)
			if err := b.record(ctx, lane, row, left, results, noLine, st.Provider, held); err != nil {
				return err
			}
		}
		if asked {
			return b.closeAs(ctx, row, st, "canceled", "canceled")
		}
		return b.closeEnded(ctx, row, st)
	}
	if se := (*StatusError)(nil); errors.As(err, &se) && se.Status == http.StatusNotFound {
		return b.closeLost(ctx, row, asked)
	}
	d := retrypolicy.Classify(err, b.cfg.Now())
	if (d.Retry && d.HasRetryAfter) || (err != nil && asked) {
		return later(err)
	}
	next := b.cfg.Now().Add(pollDelay(lane.Config, row.Polls+1))
	if asked {
		return b.store.polled(ctx, row.ID, providerCanceling, next)
	}
	// A cancel that failed (no answer, the provider's side: 408, 429, 5xx) is tried again after
	// the backoff, as a failed poll is; one refused otherwise (a 409 or 400: the batch is ending
	// or has ended) is taken as accepted: the polls that follow find it ended.
	if err := lane.Client.Cancel(ctx, *row.ProviderID); err != nil {
		var se *StatusError
		if !errors.As(err, &se) || (retryableStatus(se.Status) && se.Status != http.StatusConflict) {
			return later(err)
		}
		if se.Status == http.StatusNotFound {
			return b.closeLost(ctx, row, false)
		}
	}
	return b.store.polled(ctx, row.ID, providerCanceling, next)
}

// cancelAsked reports whether a sent batch's provider state says it is being canceled (or was,
// OpenAI's cancelled): its cancel was accepted (see closeIdle), or the provider said so when it
// was polled.
func cancelAsked(providerState string) bool {
	switch providerState {
	case providerCanceling, "cancelling", "cancelled":
		return true
	}
	return false
}

// providerCanceling is the provider state of a batch whose cancel the provider accepted, until
// a poll finds it ended (Anthropic's word; OpenAI says cancelling).
const providerCanceling = "canceling"

// closeLost closes sent batch row, none of whose jobs waits for it, which the provider no longer
// knows (404: deleted, expired from its lists, or gone with an account), logged once (the batch
// is closed): canceled when llmq's cancel of it was accepted (canceled), else ended and counted
// lost, as a lost batch whose jobs wait is (see poll). Its uploads, recorded when they were made,
// are deleted by the pass (deleteDueFiles); its output and error files, if any are left, are not
// known.
func (b *Batcher) closeLost(ctx context.Context, row batchRow, canceled bool) error {
	state, outcome, what := "ended", "lost", "a batch none of whose jobs waits"
	if canceled {
		state, outcome, what = "canceled", "canceled", "a canceled batch"
	}
	b.cfg.Logger.WarnContext(ctx, what+" is unknown to the provider: closed, its output and error files unknown",
		"batch", row.ID, "provider_batch_id", *row.ProviderID)
	b.cfg.Metrics.batch(row.Credential, outcome)
	return b.store.ended(ctx, row.ID, state, "not_found")
}

// closeEnded closes batch row, which ended at the provider (st) and whose results are
// recorded: counted ended, or refused when it failed as a whole (State.Failed) (see closeAs).
func (b *Batcher) closeEnded(ctx context.Context, row batchRow, st State) error {
	outcome := "ended"
	if st.Failed {
		outcome = "refused"
	}
	return b.closeAs(ctx, row, st, "ended", outcome)
}

// closeAs closes batch row, which ended at the provider (st), in state (ended, or canceled
// after its cancel: see closeIdle), counted as outcome, and records its files at the provider
// (st.Files) in the same transaction, for the pass's deletes (see deleteDueFiles): never before
// the close, so that a pass that fails or dies before it reads the results again on the next,
// and never lost after it, should the process die or the delete fail.
func (b *Batcher) closeAs(ctx context.Context, row batchRow, st State, state, outcome string) error {
	b.cfg.Metrics.batch(row.Credential, outcome)
	return b.store.endedWithFiles(ctx, row.ID, row.Credential, state, st.Provider, st.Files)
}

// deadLettered counts a move that dead-lettered its job (Config.DeadLettered) and alerts
// (Config.Alerter).
func (b *Batcher) deadLettered(ctx context.Context, credential string, m move) {
	if b.cfg.DeadLettered != nil {
		b.cfg.DeadLettered(credential, m.DeadReason)
	}
	msg := fmt.Sprintf("batch-lane job used all its attempts; last error: %v", m.LastError["message"])
	switch {
	case m.DeadReason == retrypolicy.DeadReasonRateLimitedNoRetryAfter && m.GiveBack:
		// The batch failed as a whole: its last error says the provider refused the batch.
		msg = fmt.Sprintf("batch-lane job dead-lettered: %v", m.LastError["message"])
	case m.DeadReason == retrypolicy.DeadReasonRateLimitedNoRetryAfter:
		msg = fmt.Sprintf("batch-lane job's request was refused with a spend cap; last error: %v", m.LastError["message"])
	}
	b.cfg.Alerter.Throttled(ctx, alert.Alert{Credential: credential, Reason: m.DeadReason, JobID: m.JobID,
		Message: msg}, time.Minute)
}

// applyMove applies m and, when it moved the job to the online lane unfinished, enqueues the
// job's task.
func (b *Batcher) applyMove(ctx context.Context, credential string, m move) error {
	priority, ok, err := b.store.apply(ctx, m)
	if ok {
		b.cfg.Metrics.job(credential, m)
		if m.Status == string(jobs.StatusDead) {
			b.deadLettered(ctx, credential, m)
		}
	}
	if err != nil || !ok || m.Lane != "online" || (m.Status != "retrying" && m.Status != "queued") {
		return err
	}
	if err := b.cfg.Enqueue(ctx, m.JobID, priority); err != nil {
		b.cfg.Logger.WarnContext(ctx, "enqueue a job leaving the batch lane failed; the sweeper will enqueue it", "job_id", m.JobID, "error", err)
	}
	return nil
}
