package api

import (
	"context"
	"errors"
	"net/http"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/redis/go-redis/v9"
)

// Readiness bounds: readyTimeout each store's check, readyAcquireWait the wait for a free
// connection of the pool before the store is asked on a connection of the check's own.
const (
	readyTimeout     = 2 * time.Second
	readyAcquireWait = 500 * time.Millisecond
)

// tooManyConnections is Postgres's SQLSTATE for a connection refused at the server's (or a
// role's, or a database's) connection limit.
const tooManyConnections = "53300"

// readyz answers whether both stores answer, each checked at once within readyTimeout, and the
// server is not draining (Drain: 503 with "shutdown": "draining"). A pool
// with every connection in use is busy, not unreachable (postgresAnswers, redisAnswers): under
// load every replica would otherwise be marked not ready at once and taken out of service.
func (s *Server) readyz(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), readyTimeout)
	defer cancel()
	var redisOK bool
	var wg sync.WaitGroup
	wg.Go(func() { redisOK = s.redisAnswers(ctx) })
	pgOK := s.postgresAnswers(ctx)
	wg.Wait()
	checks := map[string]string{"postgres": "ok", "redis": "ok"}
	status := http.StatusOK
	if !pgOK {
		checks["postgres"], status = "unreachable", http.StatusServiceUnavailable
	}
	if !redisOK {
		checks["redis"], status = "unreachable", http.StatusServiceUnavailable
	}
	if s.draining.Load() {
		checks["shutdown"], status = "draining", http.StatusServiceUnavailable
	}
	writeJSON(w, status, checks)
}

// postgresAnswers reports whether Postgres answers a ping before ctx ends: on a connection of
// the pool, or, when none comes free within readyAcquireWait (the pool is busy, or its
// connections wait on a server that stopped answering), on a connection of its own, opened
// with the pool's settings and closed at once. One such connection at a time per replica:
// probes arriving meanwhile wait for it, so a flood of /readyz cannot use up the server's
// connections. A server refusing that connection at its connection limit (53300) answers: the
// pool's connections serve, and a full server must not take every busy replica out at once.
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
	if pgErr := (*pgconn.PgError)(nil); errors.As(err, &pgErr) && pgErr.Code == tooManyConnections {
		return true // the server answered, at its connection limit: the pool works on what it holds
	}
	if err != nil {
		return false
	}
	defer func() { _ = own.Close(ctx) }() // ctx ended: closed without the goodbye
	return own.Ping(ctx) == nil
}

// redisAnswers reports whether Redis answers a ping before ctx ends: through the client's pool,
// or, when that has not answered within readyAcquireWait while every connection of the pool is
// in use, on a connection of its own (a single-node client's options, one connection, no
// retries), closed at once; one at a time per replica, as postgresAnswers. A cluster or
// failover client is asked through its pool only.
func (s *Server) redisAnswers(ctx context.Context) bool {
	pctx, cancel := context.WithTimeout(ctx, readyAcquireWait)
	err := s.cfg.Redis.Ping(pctx).Err()
	cancel()
	if err == nil {
		return true
	}
	c, ok := s.cfg.Redis.(*redis.Client)
	if !ok || ctx.Err() != nil || !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, redis.ErrPoolTimeout) {
		return false
	}
	if st := c.PoolStats(); st.IdleConns > 0 || int(st.TotalConns) < c.Options().PoolSize {
		return c.Ping(ctx).Err() == nil // not the pool: a slow Redis has the rest of the time
	}
	select {
	case s.ownRedisProbe <- struct{}{}:
		defer func() { <-s.ownRedisProbe }()
	case <-ctx.Done():
		return false
	}
	opt := *c.Options()
	opt.PoolSize, opt.MinIdleConns, opt.MaxIdleConns, opt.MaxRetries = 1, 0, 0, -1
	own := redis.NewClient(&opt)
	defer func() { _ = own.Close() }()
	return own.Ping(ctx).Err() == nil
}
