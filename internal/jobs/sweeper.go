package jobs

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/hibiken/asynq"
	"github.com/jackc/pgx/v5/pgxpool"
)

// sweeperLockKey elects the one sweeping process ("llmqswep").
const sweeperLockKey int64 = 0x6c6c6d7173776570

// SweeperConfig configures a Sweeper.
type SweeperConfig struct {
	Store     *Store
	Enqueuer  *Enqueuer
	Inspector *asynq.Inspector
	Queue     string
	// Interval between sweeps. Default 10s.
	Interval time.Duration
	Logger   *slog.Logger
	Metrics  *Metrics
	Now      func() time.Time
}

// Sweeper re-enqueues every non-terminal job whose asynq task is missing: after Redis lost data
// (a restart without persistence, a flush) or after an API process died between commit and
// enqueue. One process at a time sweeps, elected with a Postgres advisory lock.
type Sweeper struct {
	cfg SweeperConfig
}

// NewSweeper returns a Sweeper; zero config fields take their defaults.
func NewSweeper(cfg SweeperConfig) *Sweeper {
	if cfg.Interval == 0 {
		cfg.Interval = 10 * time.Second
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
func (s *Sweeper) Run(ctx context.Context) error {
	ticker := time.NewTicker(s.cfg.Interval)
	defer ticker.Stop()
	for {
		if err := s.lead(ctx, ticker.C); err != nil && ctx.Err() == nil {
			s.cfg.Logger.WarnContext(ctx, "sweeper", "error", err)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-ticker.C:
		}
	}
}

// lead takes the leader lock on a dedicated connection and sweeps on every tick while it holds it.
func (s *Sweeper) lead(ctx context.Context, tick <-chan time.Time) error {
	conn, err := s.cfg.Store.Pool().Acquire(ctx)
	if err != nil {
		return fmt.Errorf("acquire connection: %w", err)
	}
	defer conn.Release()
	var leader bool
	if err := conn.QueryRow(ctx, "SELECT pg_try_advisory_lock($1)", sweeperLockKey).Scan(&leader); err != nil {
		return fmt.Errorf("take sweeper lock: %w", err)
	}
	if !leader {
		return nil
	}
	defer unlock(ctx, conn)
	for {
		if n, err := s.SweepOnce(ctx); err != nil {
			return err
		} else if n > 0 {
			s.cfg.Logger.WarnContext(ctx, "re-enqueued jobs whose task was missing", "count", n)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-tick:
		}
		if err := conn.Ping(ctx); err != nil {
			return fmt.Errorf("sweeper lock connection: %w", err)
		}
	}
}

func unlock(ctx context.Context, conn *pgxpool.Conn) {
	uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if _, err := conn.Exec(uctx, "SELECT pg_advisory_unlock($1)", sweeperLockKey); err != nil {
		conn.Conn().Close(uctx) //nolint:errcheck // closing the session releases the lock
	}
}

// SweepOnce checks every non-terminal job once and enqueues those whose task is missing. It
// returns how many it enqueued.
func (s *Sweeper) SweepOnce(ctx context.Context) (int, error) {
	const page = 500
	enqueued := 0
	after := ""
	for {
		batch, err := s.cfg.Store.ListUnfinished(ctx, after, page)
		if err != nil {
			return enqueued, err
		}
		for _, u := range batch {
			after = u.ID
			if u.Status == StatusRunning && u.LeaseUntil != nil && u.LeaseUntil.After(s.cfg.Now()) {
				// A live attempt (its delivery renews the lease): re-enqueueing it now would
				// only make a duplicate delivery wait for the lease.
				continue
			}
			_, err := s.cfg.Inspector.GetTaskInfo(s.cfg.Queue, u.ID)
			if err == nil {
				continue
			}
			if !errors.Is(err, asynq.ErrTaskNotFound) && !errors.Is(err, asynq.ErrQueueNotFound) {
				return enqueued, fmt.Errorf("look up task %s: %w", u.ID, err)
			}
			var at time.Time
			if u.NextAttemptAt != nil {
				at = *u.NextAttemptAt
			}
			if err := s.cfg.Enqueuer.Enqueue(ctx, u.ID, at); err != nil {
				return enqueued, err
			}
			enqueued++
			s.cfg.Metrics.sweptOne()
		}
		if len(batch) < page {
			return enqueued, nil
		}
	}
}
