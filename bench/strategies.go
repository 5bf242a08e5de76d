package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"strconv"
	"sync"
	"time"
)

// The plain clients' backoff: 500 ms doubling, as a textbook retry loop does; the full-jitter
// ceiling is capped at 60 s (llmq's default retry.max_delay), which 8 attempts never reach.
const (
	backoffBase = 500 * time.Millisecond
	backoffCap  = 60 * time.Second
)

// delayFunc returns how long a client waits after its failed attempt number attempt (0 for the
// first call), given the Retry-After the provider sent (0 when absent). u draws from U[0,1).
type delayFunc func(attempt int, retryAfter time.Duration, u func() float64) time.Duration

// tenPercentJitter is a common library default: base·2^n·U(0.9, 1.1).
func tenPercentJitter(base time.Duration) delayFunc {
	return func(n int, _ time.Duration, u func() float64) time.Duration {
		return time.Duration(float64(base) * math.Pow(2, float64(n)) * (0.9 + 0.2*u()))
	}
}

// fullJitter is U(0, min(cap, base·2^n)) (Marc Brooker's "full jitter").
func fullJitter(base, ceiling time.Duration) delayFunc {
	return func(n int, _ time.Duration, u func() float64) time.Duration {
		return time.Duration(u() * math.Min(float64(ceiling), float64(base)*math.Pow(2, float64(n))))
	}
}

// retryAfterJitter is the best of the plain clients: the Retry-After the provider sent plus
// full jitter on top, so that clients told the same whole second do not come back together.
// Without a Retry-After it is plain full jitter.
func retryAfterJitter(base, ceiling time.Duration) delayFunc {
	fj := fullJitter(base, ceiling)
	return func(n int, retryAfter time.Duration, u func() float64) time.Duration {
		return retryAfter + fj(n, retryAfter, u)
	}
}

// strategy is a plain client: no shared limiter, each job retried on its own.
type strategy struct {
	attempts int
	delay    delayFunc // unused when attempts == 1
}

// simClient calls the simulator's Anthropic Messages endpoint, one HTTP request per call, no
// retries of its own. Safe for concurrent use.
type simClient struct {
	http   *http.Client
	url    string // the simulator's root URL
	apiKey string
}

// newSimClient returns a client keeping up to conns idle connections, so a herd of conns
// callers reuses them instead of dialing on every retry.
func newSimClient(url, apiKey string, conns int) *simClient {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConns = conns
	tr.MaxIdleConnsPerHost = conns
	return &simClient{http: &http.Client{Transport: tr, Timeout: 30 * time.Second}, url: url, apiKey: apiKey}
}

// close releases the client's idle connections.
func (c *simClient) close() { c.http.CloseIdleConnections() }

// callResult is one provider call's answer.
type callResult struct {
	status     int           // 0 on a transport error
	retryAfter time.Duration // 0 when absent
	err        error         // transport error
}

// retryable reports whether a plain client would try again: 408, 429, 5xx and transport errors.
func (r callResult) retryable() bool {
	return r.err != nil || r.status == http.StatusRequestTimeout || r.status == http.StatusTooManyRequests || r.status >= 500
}

// call sends request i once.
func (c *simClient) call(ctx context.Context, i int) callResult { return c.send(ctx, messagesBody(i)) }

// send sends the Messages request body once.
func (c *simClient) send(ctx context.Context, body []byte) callResult {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.url+"/v1/messages", bytes.NewReader(body))
	if err != nil {
		return callResult{err: fmt.Errorf("build request: %w", err)}
	}
	req.Header.Set("content-type", "application/json")
	req.Header.Set("x-api-key", c.apiKey)
	req.Header.Set("anthropic-version", "2023-06-01")
	resp, err := c.http.Do(req)
	if err != nil {
		return callResult{err: fmt.Errorf("call provider: %w", err)}
	}
	defer resp.Body.Close()
	if _, err := io.Copy(io.Discard, resp.Body); err != nil {
		return callResult{err: fmt.Errorf("read provider answer: %w", err)}
	}
	return callResult{status: resp.StatusCode, retryAfter: parseRetryAfter(resp.Header.Get("retry-after"), time.Now())}
}

// parseRetryAfter reads a Retry-After value: whole seconds or an HTTP-date. 0 when absent or
// unreadable.
func parseRetryAfter(v string, now time.Time) time.Duration {
	if v == "" {
		return 0
	}
	if s, err := strconv.ParseInt(v, 10, 64); err == nil {
		return time.Duration(max(s, 0)) * time.Second
	}
	if t, err := http.ParseTime(v); err == nil {
		return max(t.Sub(now), 0)
	}
	return 0
}

// runClient is one plain client for job i: call, and on a retryable failure wait the
// strategy's delay and call again, up to its attempts. It returns when the job has an outcome
// or ctx ends (then the outcome is not done). start is the herd's start.
func runClient(ctx context.Context, c *simClient, s strategy, i int, u func() float64, start time.Time) outcome {
	for attempt := 0; ; attempt++ {
		res := c.call(ctx, i)
		if ctx.Err() != nil {
			return outcome{}
		}
		if res.err == nil && res.status/100 == 2 {
			d := time.Since(start)
			return outcome{done: true, ok: true, latency: d, at: d}
		}
		if !res.retryable() || attempt+1 >= s.attempts {
			d := time.Since(start)
			return outcome{done: true, latency: d, at: d}
		}
		t := time.NewTimer(s.delay(attempt, res.retryAfter, u))
		select {
		case <-ctx.Done():
			t.Stop()
			return outcome{}
		case <-t.C:
		}
	}
}

// runStrategy fires n plain clients at once against the simulator and returns their outcomes.
// Client i draws its jitter from a PCG seeded with (seed, i), so runs repeat as far as timing
// allows. Each job that reaches an outcome is recorded in e.progress. Jobs still waiting after
// e.timeout, or when ctx ends, have no outcome (not done).
func runStrategy(ctx context.Context, e *rowEnv, s strategy) []outcome {
	ctx, cancel := context.WithTimeout(ctx, e.timeout)
	defer cancel()
	c := newSimClient(e.simURL, e.apiKey, e.n)
	defer c.close()
	outs := make([]outcome, e.n)
	fire := make(chan struct{})
	var wg sync.WaitGroup
	var start time.Time
	for i := range e.n {
		u := rand.New(rand.NewPCG(e.seed, uint64(i))).Float64
		wg.Go(func() {
			<-fire
			outs[i] = runClient(ctx, c, s, i, u, start)
			if outs[i].done {
				e.progress.record(outs[i].ok)
			}
		})
	}
	e.started()
	start = time.Now()
	close(fire)
	wg.Wait()
	return outs
}
