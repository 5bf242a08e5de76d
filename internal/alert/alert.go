// Package alert raises dead-letter alerts: an ERROR log line ("ALERT dead letter") and a JSON POST
// to the configured webhook, once per episode (a credential's pause) or at most once per interval
// per credential and reason across every worker process (a Redis key per throttle). The POST goes
// in the background: raising an alert never waits for the webhook.
package alert

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// Alert is one dead-letter alert, as logged and as POSTed to the webhook.
type Alert struct {
	Credential string    `json:"credential"`
	Reason     string    `json:"reason"`
	JobID      string    `json:"job_id"`
	Message    string    `json:"message"`
	At         time.Time `json:"at"`
}

// Config configures an Alerter.
type Config struct {
	// WebhookURL receives each alert as a JSON POST; empty disables the webhook.
	WebhookURL string
	// Redis, when set, makes Throttled alerts once per key per interval across all processes;
	// without it the throttle is per process.
	Redis redis.UniversalClient
	// Prefix starts the throttle keys. Default "llmq:".
	Prefix string
	// HTTPClient posts to the webhook (default: a client with PostTimeout as its timeout). The
	// Alerter uses a copy that never follows a redirect: a redirect answer is a failure.
	HTTPClient *http.Client
	Logger     *slog.Logger
	Now        func() time.Time
	// Metrics counts the webhook's failures; nil records none.
	Metrics *Metrics
	// PostTimeout bounds one POST to the webhook, from its start to its answer: past it the
	// alert is logged and counted as a webhook failure. Default 10s; tests that hold a webhook's
	// answer for as long as a loaded machine makes them lengthen it past their own deadline.
	PostTimeout time.Duration
}

// maxPosts bounds the webhook POSTs under way at once (each ends within Config.PostTimeout): an
// alert raised while this many are under way is logged and counted as a webhook failure, not
// posted. Alerts are rare (once per episode, or per minute per credential and reason), so only a
// webhook that hangs fills it.
const maxPosts = 8

// defaultPostTimeout is Config.PostTimeout's default.
const defaultPostTimeout = 10 * time.Second

// Alerter raises dead-letter alerts: an ERROR log line and the webhook. (The counter
// llmq_dead_letters_total is kept per job by the executor.) It is safe for concurrent use.
type Alerter struct {
	cfg Config

	// posts holds a token per webhook POST under way (at most maxPosts).
	posts chan struct{}
	// postsMu guards inFlight, the POSTs under way, and idle, closed when inFlight drops to 0
	// (Wait's signal). Not a sync.WaitGroup: a Raise may come while a Wait that gave up at its
	// deadline still waits, which a WaitGroup forbids (it panics when an Add from zero meets a
	// Wait not yet returned).
	postsMu  sync.Mutex
	inFlight int
	idle     chan struct{}

	// mu guards raised: when each (credential, reason) was last raised by Throttled, for the
	// throttle without Redis.
	mu     sync.Mutex
	raised map[string]time.Time
}

// New returns an Alerter; zero fields take defaults.
func New(cfg Config) *Alerter {
	if cfg.Prefix == "" {
		cfg.Prefix = "llmq:"
	}
	if cfg.PostTimeout <= 0 {
		cfg.PostTimeout = defaultPostTimeout
	}
	if cfg.HTTPClient == nil {
		cfg.HTTPClient = &http.Client{Timeout: cfg.PostTimeout}
	}
	// A redirect is not followed: a 301/302/303 would turn the POST into a GET without the body
	// (whose 200 reads as delivered), and a 307/308 would send the body, which names credentials
	// and jobs, to wherever it points. The 3xx answer itself fails the post (status above 299).
	hc := *cfg.HTTPClient
	hc.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	cfg.HTTPClient = &hc
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Alerter{cfg: cfg, posts: make(chan struct{}, maxPosts), raised: map[string]time.Time{}}
}

// Raise logs a and starts its POST to the webhook, without waiting for it: a slow or hung
// webhook delays no delivery, failover or pause. Callers make sure it is once per episode (a
// pause reports whether it began one); use Throttled for alerts without episodes. A webhook
// failure (or an alert not posted because maxPosts are under way) is logged and counted
// (llmq_alert_webhook_failures_total), not returned or retried: the dead letter is already safe
// in Postgres.
func (a *Alerter) Raise(ctx context.Context, al Alert) {
	if a == nil {
		return
	}
	if al.At.IsZero() {
		al.At = a.cfg.Now()
	}
	a.cfg.Logger.ErrorContext(ctx, "ALERT dead letter", "credential", al.Credential, "reason", al.Reason,
		"first_job_id", al.JobID, "message", al.Message)
	if a.cfg.WebhookURL == "" {
		return
	}
	select {
	case a.posts <- struct{}{}:
	default:
		a.webhookFailed(ctx, al, fmt.Errorf("%d posts to the webhook are under way: this alert is not posted", maxPosts))
		return
	}
	a.postsMu.Lock()
	if a.inFlight == 0 {
		a.idle = make(chan struct{})
	}
	a.inFlight++
	a.postsMu.Unlock()
	ctx = context.WithoutCancel(ctx) // the POST outlives the caller
	go func() {
		defer a.postDone()
		defer func() { <-a.posts }()
		if err := a.post(ctx, al); err != nil {
			a.webhookFailed(ctx, al, err)
		}
	}()
}

// webhookFailed logs and counts an alert the webhook did not take.
func (a *Alerter) webhookFailed(ctx context.Context, al Alert, err error) {
	a.cfg.Metrics.webhookFailed()
	a.cfg.Logger.ErrorContext(ctx, "alert webhook failed", "credential", al.Credential, "reason", al.Reason, "error", err)
}

// postDone marks a POST ended, closing idle when it was the last under way.
func (a *Alerter) postDone() {
	a.postsMu.Lock()
	defer a.postsMu.Unlock()
	a.inFlight--
	if a.inFlight == 0 {
		close(a.idle)
	}
}

// Wait returns once no webhook POST is under way (each ends within PostTimeout; one a Raise
// starts while others are still under way is waited for too), or with ctx's error when ctx ends
// first. Call it after the last Raise (a worker's shutdown, a test), so that the alerts of the
// last deliveries are posted before the process goes. It starts nothing: a Wait that gave up
// leaves nothing behind, and a Raise may come during or after it.
func (a *Alerter) Wait(ctx context.Context) error {
	if a == nil {
		return nil
	}
	a.postsMu.Lock()
	idle := a.idle
	n := a.inFlight
	a.postsMu.Unlock()
	if n == 0 {
		return nil
	}
	select {
	case <-idle:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("wait for the alert webhook's posts: %w", ctx.Err())
	}
}

// Throttled raises al at most once per interval per (credential, reason), across processes when
// Redis is configured.
func (a *Alerter) Throttled(ctx context.Context, al Alert, interval time.Duration) {
	if a == nil {
		return
	}
	key := fmt.Sprintf("%salert:%s:%s", a.cfg.Prefix, al.Credential, al.Reason)
	if a.cfg.Redis == nil {
		if !a.firstInInterval(key, interval) {
			return
		}
	} else {
		ok, err := a.cfg.Redis.SetNX(ctx, key, al.JobID, interval).Result()
		if err == nil && !ok {
			return
		}
		// On a Redis error, alert anyway: a duplicate alert beats a lost one.
	}
	a.Raise(ctx, al)
}

// firstInInterval reports whether key was not raised in this process within the last interval,
// and if so records that it is raised now: Throttled's throttle without Redis.
func (a *Alerter) firstInInterval(key string, interval time.Duration) bool {
	now := a.cfg.Now()
	a.mu.Lock()
	defer a.mu.Unlock()
	if last, ok := a.raised[key]; ok && now.Sub(last) < interval {
		return false
	}
	a.raised[key] = now
	return true
}

func (a *Alerter) post(ctx context.Context, al Alert) error {
	body, err := json.Marshal(al)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, a.cfg.PostTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, a.cfg.WebhookURL, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := a.cfg.HTTPClient.Do(req)
	if err != nil {
		// Not the *url.Error as it is: it quotes the whole URL, and a chat webhook's path is
		// its secret.
		var uerr *url.Error
		if errors.As(err, &uerr) {
			return fmt.Errorf("POST to %s: %w", req.URL.Host, uerr.Err)
		}
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode >= 300 && resp.StatusCode < 400 {
		return fmt.Errorf("webhook answered %s (a redirect: not followed)", resp.Status)
	}
	if resp.StatusCode >= 400 {
		return fmt.Errorf("webhook answered %s", resp.Status)
	}
	return nil
}
