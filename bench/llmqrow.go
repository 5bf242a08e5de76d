package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
	"time"
)

// Polling of job status: every pollInterval, the outstanding jobs are fetched with at most
// pollConcurrency requests in flight, so 100 jobs do not cost 5,000 requests a second on a
// small machine. A result is seen at most one round after it is stored.
const (
	pollInterval    = 20 * time.Millisecond
	pollConcurrency = 8
)

// llmqRow returns the run of a row that puts the burst through the whole system, configured by
// setup: a fresh database and queue, the api binary and -workers worker binaries, jobs
// submitted and polled over HTTP. Everything it created is removed when it returns (the config
// and logs are kept with -keep-logs, or when it fails).
func llmqRow(setup llmqSetup) func(context.Context, *rowEnv) ([]outcome, error) {
	return func(ctx context.Context, e *rowEnv) (outs []outcome, err error) {
		d, err := deploy(ctx, deployOpts{adminURL: e.dbURL, redisURL: e.redisURL, simURL: e.simURL, setup: setup})
		if err != nil {
			return nil, err
		}
		defer func() { d.close(e.keepLogs || (err != nil && ctx.Err() == nil), e.log) }()
		workers := e.workers
		if setup.workers > 0 {
			workers = setup.workers
		}
		st, err := startStack(ctx, d.stack(e.bin, e.redisURL), workers)
		if err != nil {
			return nil, err
		}
		defer st.stop()
		e.log("  api at %s and %d workers ready", st.apiURL, workers)
		if outs, err = burstOverHTTP(ctx, e, st); err != nil {
			return nil, err
		}
		if err := st.stop(); err != nil {
			e.log("  stopping the stack: %v", err)
		}
		return outs, nil
	}
}

// burstOverHTTP submits e.n jobs at once to the stack's API and polls them until every one is
// terminal or e.timeout passes from the first submit.
func burstOverHTTP(ctx context.Context, e *rowEnv, st *stack) ([]outcome, error) {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConns = e.n + pollConcurrency
	tr.MaxIdleConnsPerHost = e.n + pollConcurrency
	hc := &http.Client{Transport: tr, Timeout: 30 * time.Second}
	defer hc.CloseIdleConnections()

	ctx, cancel := context.WithTimeout(ctx, e.timeout)
	defer cancel()
	ids := make([]string, e.n)
	submitted := make([]time.Duration, e.n)
	errs := make([]error, e.n)
	fire := make(chan struct{})
	var wg sync.WaitGroup
	var start time.Time
	for i := range e.n {
		wg.Go(func() {
			<-fire
			submitted[i] = time.Since(start)
			a, err := submitJob(ctx, hc, st.apiURL, i, jobBody(e.requestBody(i), e.jobMaxAttempts(), 5*time.Minute))
			if ids[i] = a.id(); err == nil && ids[i] == "" {
				err = fmt.Errorf("job %d: no id in %s", i, a.body)
			}
			errs[i] = err
		})
	}
	e.started()
	start = time.Now()
	close(fire)
	wg.Wait()
	var failed []error
	for _, err := range errs {
		if err != nil {
			failed = append(failed, err)
		}
	}
	if len(failed) > 0 {
		return nil, fmt.Errorf("%d of %d submits failed, the first: %w", len(failed), e.n, failed[0])
	}
	e.log("  %d jobs submitted in %s", e.n, seconds(time.Since(start)))

	outs := make([]outcome, e.n)
	statuses := map[string]int{}
	pending := make([]int, e.n)
	for i := range pending {
		pending[i] = i
	}
	tick := time.NewTicker(pollInterval)
	defer tick.Stop()
	for len(pending) > 0 {
		if err := st.exited(); err != nil {
			return nil, err
		}
		got := pollJobs(ctx, hc, st.apiURL, ids, pending)
		now := time.Since(start)
		var still []int
		for k, i := range pending {
			status := got[k]
			if !terminal(status) {
				still = append(still, i)
				continue
			}
			statuses[status]++
			outs[i] = outcome{done: true, ok: status == "succeeded", latency: now - submitted[i], at: now}
			e.progress.record(status == "succeeded")
		}
		pending = still
		if len(pending) == 0 {
			break
		}
		select {
		case <-ctx.Done():
			if cause := context.Cause(ctx); !errors.Is(cause, context.DeadlineExceeded) {
				return nil, fmt.Errorf("interrupted: %w", cause)
			}
			e.log("  timeout: %d jobs not terminal after %s", len(pending), e.timeout)
			pending = nil
		case <-tick.C:
		}
	}
	if len(statuses) > 1 || (len(statuses) == 1 && statuses["succeeded"] == 0) {
		e.log("  terminal statuses: %v", statuses)
	}
	return outs, nil
}

// pollJobs fetches the status of ids[pending[k]] for every k, at most pollConcurrency at once.
// A failed fetch yields "" (not terminal; it is asked again next round).
func pollJobs(ctx context.Context, hc *http.Client, apiURL string, ids []string, pending []int) []string {
	out := make([]string, len(pending))
	sem := make(chan struct{}, pollConcurrency)
	var wg sync.WaitGroup
	for k, i := range pending {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			out[k] = jobStatus(ctx, hc, apiURL, ids[i])
		})
	}
	wg.Wait()
	return out
}

func jobStatus(ctx context.Context, hc *http.Client, apiURL, id string) string {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, apiURL+"/v1/jobs/"+id, nil)
	if err != nil {
		return ""
	}
	resp, err := hc.Do(req)
	if err != nil {
		return ""
	}
	defer resp.Body.Close()
	var job struct {
		Status string `json:"status"`
	}
	if resp.StatusCode != http.StatusOK || json.NewDecoder(resp.Body).Decode(&job) != nil {
		_, _ = io.Copy(io.Discard, resp.Body)
		return ""
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	return job.Status
}

func terminal(status string) bool {
	switch status {
	case "succeeded", "failed", "dead", "canceled":
		return true
	}
	return false
}
