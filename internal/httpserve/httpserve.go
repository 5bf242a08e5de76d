// Package httpserve builds llmq's HTTP servers to survive hostile clients: timeouts on reading a
// request, on writing its answer and on idle keep-alive connections, and a cap on open
// connections above which a new one is answered 503 and closed at once. cmd/api and the worker's
// /metrics server use it; handlers that stream (event streams) set their own write deadline per
// write through http.ResponseController and clear the read deadline.
package httpserve

import (
	"log/slog"
	"net/http"
	"time"

	"github.com/llmq/llmq/internal/config"
)

// Config configures a server. Zero fields take the defaults documented on each.
type Config struct {
	// ReadTimeout bounds reading one request, headers and body, from its first byte: a client
	// that trickles its body is cut off. Default 30s.
	ReadTimeout time.Duration
	// ReadHeaderTimeout bounds reading one request's headers. Default 10s, at most ReadTimeout.
	ReadHeaderTimeout time.Duration
	// WriteTimeout bounds writing one answer, from the end of its request's headers: a reader
	// that stalls is cut off. Default 30s.
	WriteTimeout time.Duration
	// IdleTimeout closes a keep-alive connection that sends no request for that long. Default 60s.
	IdleTimeout time.Duration
	// ErrorLog receives the server's own errors (a failed accept, a TLS handshake). Default:
	// discarded.
	ErrorLog *slog.Logger
}

// FromConfig returns the server settings of the config file's api section, which also apply to
// the worker's /metrics server.
func FromConfig(c config.API) Config {
	return Config{ReadTimeout: c.ReadTimeout, WriteTimeout: c.WriteTimeout, IdleTimeout: c.IdleTimeout}
}

func (c Config) withDefaults() Config {
	if c.ReadTimeout == 0 {
		c.ReadTimeout = 30 * time.Second
	}
	if c.ReadHeaderTimeout == 0 {
		c.ReadHeaderTimeout = 10 * time.Second
	}
	c.ReadHeaderTimeout = min(c.ReadHeaderTimeout, c.ReadTimeout)
	if c.WriteTimeout == 0 {
		c.WriteTimeout = 30 * time.Second
	}
	if c.IdleTimeout == 0 {
		c.IdleTimeout = 60 * time.Second
	}
	if c.ErrorLog == nil {
		c.ErrorLog = slog.New(slog.DiscardHandler)
	}
	return c
}

// NewServer returns an http.Server for h with cfg's timeouts. Serve it on a listener from
// LimitListener to cap its connections.
func NewServer(h http.Handler, cfg Config) *http.Server {
	cfg = cfg.withDefaults()
	return &http.Server{
		Handler:           h,
		ReadTimeout:       cfg.ReadTimeout,
		ReadHeaderTimeout: cfg.ReadHeaderTimeout,
		WriteTimeout:      cfg.WriteTimeout,
		IdleTimeout:       cfg.IdleTimeout,
		ErrorLog:          slog.NewLogLogger(cfg.ErrorLog.Handler(), slog.LevelWarn),
	}
}
