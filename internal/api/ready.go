package api

import (
	"context"
	"errors"
	"net/http"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

// Readiness bounds: readyTimeout each store's check, readyAcquireWait the wait for a free
// connection of the pool before Postgres is asked on a connection of the check's own.
const (
	readyTimeout     = 2 * time.Second
	readyAcquireWait = 500 * time.Millisecond
)

// readyz answers whether both stores answer, each checked at once within readyTimeout. A pool
// with every connection in use is busy, not unreachable (postgresAnswers): under load every
// replica would otherwise be marked not ready at once and taken out of service.
func (s *Server) readyz(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), readyTimeout)
	defer cancel()
	var redisErr error
	var wg sync.WaitGroup
	wg.Go(func() { redisErr = s.cfg.Redis.Ping(ctx).Err() })
	pgOK := s.postgresAnswers(ctx)
	wg.Wait()
	checks := map[string]string{"postgres": "ok", "redis": "ok"}
	status := http.StatusOK
	if !pgOK {
		checks["postgres"], status = "unreachable", http.StatusServiceUnavailable
	}
	if redisErr != nil {
		checks["redis"], status = "unreachable", http.StatusServiceUnavailable
	}
	writeJSON(w, status, checks)
}

// postgresAnswers reports whether Postgres answers a ping before ctx ends: on a connection of
// the pool, or, when none comes free within readyAcquireWait (the pool is busy, or its
// connections wait on a server that stopped answering), on a connection of its own, opened
// with the pool's settings and closed at once. One such connection at a time per replica:
// probes arriving meanwhile wait for it, so a flood of /readyz cannot use up the server's
// connections.
func (s *Server) postgresAnswers(ctx context.Context) bool {
	actx, cancel := context.WithTimeout(ctx, readyAcquireWait)
	conn, err := s.cfg.Pool.Acquire(actx)
	cancel()
	if err == nil {
		defer conn.Release()
		return conn.Ping(ctx) == nil
	}
	if ctx.Err() != nil || !errors.Is(err, context.DeadlineExceeded) {
		return false // refused, or no time left: not a busy pool
	}
	select {
	case s.ownProbe <- struct{}{}:
		defer func() { <-s.ownProbe }()
	case <-ctx.Done():
		return false
	}
	own, err := pgx.ConnectConfig(ctx, s.cfg.Pool.Config().ConnConfig)
	if err != nil {
		return false
	}
	defer func() { _ = own.Close(ctx) }() // ctx ended: closed without the goodbye
	return own.Ping(ctx) == nil
}
