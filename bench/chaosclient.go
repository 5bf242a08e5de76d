package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
)

// chaosSubmit is what the client saw of one job's submission: every answer, and whether (and
// how) the job was accepted.
type chaosSubmit struct {
	key      string // its Idempotency-Key
	id       string // the job ID the API answered with; "" when never accepted
	accepted bool
	// replayed: accepted by a 200 Idempotent-Replayed answer, i.e. an earlier try had been
	// committed although the client never learned it (a 503 or a lost connection).
	replayed   bool
	acceptedAt time.Duration // since the run's start
	answers    []chaosAnswer
	giveUp     string // why the client stopped trying, when it did
}

// chaosAnswer is one answer to a submit.
type chaosAnswer struct {
	at         time.Duration // since the run's start
	api        int           // which API process
	status     int           // 0: no HTTP answer (transport error)
	retryAfter string        // the Retry-After header
	message    string        // transport error, or the error body of a 5xx
}

// Client behaviour: how long one job is retried, and the waits between tries.
const (
	chaosSubmitPatience   = 2 * time.Minute
	chaosTransportBackoff = time.Second
	chaosRetrySpread      = 500 * time.Millisecond
)

// chaosClient submits jobs the way a careful client would: one Idempotency-Key per job, 503 and
// 429 retried after their Retry-After (plus a random spread), 5xx and transport errors retried
// after a second, tries spread over the API processes like a load balancer would.
type chaosClient struct {
	hc      *http.Client
	apiURLs []string
	start   time.Time
	// rand returns a float64 in [0,1); called from many goroutines, so it must be safe for that.
	rand func() float64
}

// submit posts job i with provider request body under key until it is accepted, a 4xx other
// than 429 refuses it, chaosSubmitPatience passes, or ctx ends.
func (c *chaosClient) submit(ctx context.Context, i int, key string, request []byte, maxAttempts int) chaosSubmit {
	s := chaosSubmit{key: key}
	body := jobBody(request, maxAttempts, 15*time.Minute)
	began := time.Now()
	for try := 0; ; try++ {
		api := (i + try) % len(c.apiURLs)
		a, id := c.post(ctx, api, key, body)
		s.answers = append(s.answers, a)
		var wait time.Duration
		switch {
		case a.status == http.StatusAccepted || a.status == http.StatusOK:
			if id == "" {
				s.giveUp = fmt.Sprintf("answer %d without a job id", a.status)
				return s
			}
			s.id, s.accepted, s.replayed, s.acceptedAt = id, true, a.status == http.StatusOK, a.at
			return s
		case a.status == 0 || (a.status >= 500 && a.status != http.StatusServiceUnavailable):
			wait = chaosTransportBackoff
		case a.status == http.StatusServiceUnavailable || a.status == http.StatusTooManyRequests:
			wait = time.Second
			if secs, err := strconv.Atoi(strings.TrimSpace(a.retryAfter)); err == nil && secs >= 0 {
				wait = time.Duration(secs) * time.Second
			}
		default:
			s.giveUp = fmt.Sprintf("refused with %d: %s", a.status, a.message)
			return s
		}
		wait += time.Duration(c.rand() * float64(chaosRetrySpread))
		if time.Since(began)+wait > chaosSubmitPatience {
			s.giveUp = fmt.Sprintf("not accepted after %s of tries", chaosSubmitPatience)
			return s
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			s.giveUp = "interrupted"
			return s
		case <-t.C:
		}
	}
}

// post sends one try and returns the answer and, for a 200 or 202, the job ID.
func (c *chaosClient) post(ctx context.Context, api int, key string, body []byte) (chaosAnswer, string) {
	a := chaosAnswer{at: time.Since(c.start), api: api}
	got, err := postJob(ctx, c.hc, c.apiURLs[api], body, key)
	a.status, a.retryAfter, a.message = got.status, got.retryAfter, got.body
	if err != nil {
		a.message = err.Error()
	}
	return a, got.id()
}

// lockedRand is a seeded source of float64s in [0,1), safe for concurrent use.
func lockedRand(seed uint64) func() float64 {
	r := rand.New(rand.NewPCG(seed, 0x63686173))
	var mu sync.Mutex
	return func() float64 {
		mu.Lock()
		defer mu.Unlock()
		return r.Float64()
	}
}
