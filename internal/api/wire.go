package api

import (
	"errors"
	"log/slog"

	"github.com/hibiken/asynq"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/llmq/llmq/internal/config"
	"github.com/llmq/llmq/internal/jobs"
)

// FromConfig builds a Server from the config file on a migrated pool, registering its metrics on
// reg. The returned close function releases its Redis connections (not the pool).
func FromConfig(cfg *config.Config, pool *pgxpool.Pool, reg *prometheus.Registry, logger *slog.Logger) (*Server, func() error, error) {
	redisOpt, err := jobs.RedisConnOpt(cfg.RedisURL)
	if err != nil {
		return nil, nil, err
	}
	rdb := jobs.NewRedisClient(redisOpt)
	aclient := asynq.NewClient(redisOpt)
	store := jobs.NewStore(pool, nil)
	names := make([]string, 0, len(cfg.Credentials))
	for _, c := range cfg.Credentials {
		names = append(names, c.Name)
	}
	submitter := jobs.NewSubmitter(store, jobs.NewEnqueuer(aclient, cfg.Worker.Queue),
		jobs.SubmitConfig{Credentials: names, DefaultMaxAttempts: cfg.Retry.MaxAttempts}, logger, jobs.NewMetrics(reg))
	s := New(Config{
		Store: store, Submitter: submitter, Pool: pool, Redis: rdb, Gatherer: reg,
		AllowAnonymous: cfg.API.AllowAnonymous, MaxBodyBytes: cfg.API.MaxBodyBytes, Logger: logger,
	})
	return s, func() error { return errors.Join(aclient.Close(), rdb.Close()) }, nil
}
