package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"time"
)

// jobBody is a POST /v1/jobs body: the provider request, max_attempts and the deadline.
func jobBody(request []byte, maxAttempts int, timeout time.Duration) []byte {
	return fmt.Appendf(nil, `{"request":%s,"max_attempts":%d,"timeout":%q}`, request, maxAttempts, timeout.String())
}

// jobAnswer is the API's answer to POST /v1/jobs.
type jobAnswer struct {
	status     int
	retryAfter string // the Retry-After header
	body       string // the answer, trimmed
}

// id is the job's ID in a 200 or 202 answer; "" otherwise.
func (a jobAnswer) id() string {
	var job struct {
		ID string `json:"id"`
	}
	if a.status != http.StatusOK && a.status != http.StatusAccepted || json.Unmarshal([]byte(a.body), &job) != nil {
		return ""
	}
	return job.ID
}

// postJob posts body to the API at apiURL, with an Idempotency-Key when key is not empty. An
// error means that no answer was read.
func postJob(ctx context.Context, hc *http.Client, apiURL string, body []byte, key string) (jobAnswer, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, apiURL+"/v1/jobs", bytes.NewReader(body))
	if err != nil {
		return jobAnswer{}, fmt.Errorf("build request: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	resp, err := hc.Do(req)
	if err != nil {
		return jobAnswer{}, err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	a := jobAnswer{status: resp.StatusCode, retryAfter: resp.Header.Get("Retry-After"), body: string(bytes.TrimSpace(raw))}
	if err != nil {
		return a, fmt.Errorf("read answer: %w", err)
	}
	return a, nil
}

// submitJob posts job i; anything but a 202 is an error.
func submitJob(ctx context.Context, hc *http.Client, apiURL string, i int, body []byte) (jobAnswer, error) {
	return submitKeyedJob(ctx, hc, apiURL, i, body, "")
}

// submitKeyedJob is submitJob with an Idempotency-Key (none when key is empty).
func submitKeyedJob(ctx context.Context, hc *http.Client, apiURL string, i int, body []byte, key string) (jobAnswer, error) {
	a, err := postJob(ctx, hc, apiURL, body, key)
	switch {
	case err != nil:
		return a, fmt.Errorf("job %d: %w", i, err)
	case a.status != http.StatusAccepted:
		return a, fmt.Errorf("job %d: POST /v1/jobs answered %d: %s", i, a.status, a.body)
	}
	return a, nil
}
