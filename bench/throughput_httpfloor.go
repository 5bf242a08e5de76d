package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"

	"github.com/hibiken/asynq"

	"github.com/llmq/llmq/internal/llmsim"
)

// httpFloorSystem is the floor of llmq's contract with none of its guarantees: clients POST a
// job over HTTP to an API that inserts a row holding the request and enqueues its task; the
// handler sends the request to the provider over HTTP and stores the answer in the row. No
// idempotency, limiter, breaker, lease, attempt record or event. Everything, clients and
// simulator included, runs in this process, which spares it the hand-offs between llmq's
// api and worker processes: what it costs is a lower bound for any queue that takes jobs over
// HTTP and calls its provider over HTTP, as llmq must.
type httpFloorSystem struct {
	floorBase
	apiURL string
	simURL string
	hc     *http.Client // submitting clients and the handler's provider calls
}

// httpFloorKey is the API key the floor's provider calls carry (llmsim wants one).
const httpFloorKey = "sk-bench-floor"

func (s *httpFloorSystem) prepare(ctx context.Context, total int) error {
	if err := s.prepareStores(ctx, "httpfloor", total); err != nil {
		return err
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConns = s.o.clients + s.o.concurrency() + openLoopMaxInFlight
	tr.MaxIdleConnsPerHost = tr.MaxIdleConns
	s.hc = &http.Client{Transport: tr}
	s.c.add(s.hc.CloseIdleConnections)
	sim := httptest.NewServer(llmsim.New(llmsim.Config{}))
	s.c.add(sim.Close)
	s.simURL = sim.URL
	api := httptest.NewServer(http.HandlerFunc(s.serveSubmit))
	s.c.add(api.Close)
	s.apiURL = api.URL
	return s.startServer(asynq.HandlerFunc(s.handle))
}

// httpFloorJob is the body clients POST: the index and the provider request.
type httpFloorJob struct {
	I       int             `json:"i"`
	Request json.RawMessage `json:"request"`
}

// serveSubmit is the floor's API: decode, insert the row, enqueue its task, answer 202.
func (s *httpFloorSystem) serveSubmit(w http.ResponseWriter, r *http.Request) {
	var job httpFloorJob
	if err := json.NewDecoder(r.Body).Decode(&job); err != nil || len(job.Request) == 0 {
		http.Error(w, "want {\"i\": n, \"request\": {...}}", http.StatusBadRequest)
		return
	}
	ctx := r.Context()
	if _, err := s.pool.Exec(ctx, `INSERT INTO bench_jobs (id, request) VALUES ($1, $2)`, job.I, []byte(job.Request)); err != nil {
		http.Error(w, "insert: "+err.Error(), http.StatusInternalServerError)
		return
	}
	id := strconv.Itoa(job.I)
	if _, err := s.client.EnqueueContext(ctx, asynq.NewTask(tpTaskType, job.Request), asynq.Queue(s.queue), asynq.TaskID(id)); err != nil {
		http.Error(w, "enqueue: "+err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("content-type", "application/json")
	w.WriteHeader(http.StatusAccepted)
	fmt.Fprintf(w, `{"id":%q}`, id)
}

// handle sends the task's request to the provider and stores the answer in the row, if the row
// is still queued.
func (s *httpFloorSystem) handle(ctx context.Context, t *asynq.Task) error {
	id, _ := asynq.GetTaskID(ctx)
	i, err := strconv.Atoi(id)
	if err != nil {
		return fmt.Errorf("bad task id %q: %w", id, asynq.SkipRetry)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.simURL+"/v1/messages", bytes.NewReader(t.Payload()))
	if err != nil {
		return fmt.Errorf("build provider request: %w", err)
	}
	req.Header.Set("content-type", "application/json")
	req.Header.Set("x-api-key", httpFloorKey)
	req.Header.Set("anthropic-version", "2023-06-01")
	resp, err := s.hc.Do(req)
	if err != nil {
		return fmt.Errorf("call provider: %w", err)
	}
	answer, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		return fmt.Errorf("read provider answer: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("provider answered %d: %s", resp.StatusCode, answer)
	}
	if _, err := s.pool.Exec(ctx, `UPDATE bench_jobs SET status = 'done', result = $2, finished_at = now() WHERE id = $1 AND status = 'queued'`,
		i, answer); err != nil {
		return fmt.Errorf("store job %d: %w", i, err)
	}
	if s.t != nil { // nil in the floor's own process (httpfloor-serve)
		s.t.completed(i)
	}
	return nil
}

func (s *httpFloorSystem) submit(ctx context.Context, i int) error {
	body, err := json.Marshal(httpFloorJob{I: i, Request: messagesBody(i)})
	if err != nil {
		return fmt.Errorf("encode job %d: %w", i, err)
	}
	s.t.submitted(i)
	return postBenchJob(ctx, s.hc, s.apiURL, i, body)
}

// postBenchJob posts job i's body to the /jobs of a bench row's own API (the floor over HTTP's,
// River over HTTP's); anything but a 202 is an error.
func postBenchJob(ctx context.Context, hc *http.Client, apiURL string, i int, body []byte) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, apiURL+"/jobs", bytes.NewReader(body))
	if err != nil {
		return fmt.Errorf("build submit %d: %w", i, err)
	}
	req.Header.Set("content-type", "application/json")
	resp, err := hc.Do(req)
	if err != nil {
		return fmt.Errorf("submit job %d: %w", i, err)
	}
	msg, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusAccepted {
		return fmt.Errorf("submit job %d: %d %s", i, resp.StatusCode, bytes.TrimSpace(msg))
	}
	return nil
}
