package api

import (
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/llmq/llmq/internal/config"
	"github.com/llmq/llmq/internal/console"
	"github.com/llmq/llmq/internal/dispatch"
	"github.com/llmq/llmq/internal/jobs"
)

// newConsole builds the operators' console (/console/) on the API's stores and listener; its
// cancels count in the API's metrics m, and its live pages take a stream place of openStream's.
func newConsole(cfg *config.Config, prefix string, pool *pgxpool.Pool, store *jobs.Store, rdb redis.UniversalClient,
	tasks *dispatch.Tasks, afterCommit *dispatch.AfterCommit, listener *jobs.Listener,
	openStream func() (func(), time.Duration, bool), m *Metrics, logger *slog.Logger) (*console.Handler, error) {
	creds := make([]console.Credential, 0, len(cfg.Credentials))
	for _, c := range cfg.Credentials {
		cc := console.Credential{Name: c.Name, Provider: c.Provider}
		if l := c.Limits; l != nil {
			cc.RequestsPerSecond, cc.Burst = l.RequestsPerSecond, l.Burst
		}
		creds = append(creds, cc)
	}
	return console.New(console.Config{Pool: pool, Jobs: store, Tasks: tasks, AfterCommit: afterCommit, Redis: rdb, Credentials: creds,
		Canceled: m.canceled, Listener: listener, Logger: logger, RedisPrefix: prefix,
		EventWriteTimeout: cfg.API.EventWriteTimeout, ActionTimeout: cfg.API.StoreTimeout, OpenStream: openStream,
		// Below write_timeout, which would cut the read's 503; the overview's counts over a large
		// backlog may take longer than store_timeout.
		ReadTimeout: max(cfg.API.StoreTimeout, cfg.API.WriteTimeout*2/3)})
}
