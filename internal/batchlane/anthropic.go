package batchlane

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"time"
)

// anthropicClient speaks Message Batches (POST /v1/messages/batches and friends).
type anthropicClient struct{ httpClient }

type anthropicBatch struct {
	ID               string         `json:"id"`
	ProcessingStatus string         `json:"processing_status"`
	RequestCounts    map[string]int `json:"request_counts"`
	CreatedAt        time.Time      `json:"created_at"`
}

func (c *anthropicClient) Submit(ctx context.Context, _ string, reqs []Request, _ func(string) error) (string, error) {
	type item struct {
		CustomID string          `json:"custom_id"`
		Params   json.RawMessage `json:"params"`
	}
	items := make([]item, len(reqs))
	for i, r := range reqs {
		items[i] = item{CustomID: r.CustomID, Params: r.Body}
	}
	var b anthropicBatch
	if err := c.doJSON(ctx, "POST", "/v1/messages/batches", map[string]any{"requests": items}, &b); err != nil {
		return "", fmt.Errorf("create message batch: %w", err)
	}
	return b.ID, nil
}

// Find: Message Batches keep no metadata, so the batch is recognised by its creation time (at
// or after since, less findSkew of clock skew) and its number of requests (those of the send
// looked up, its start since: a batch's sends shrink as its jobs leave it); of several not taken
// by another of llmq's batches, the earliest. The list (newest first) is read a page of 100 at a
// time until a batch created before that, as OpenAI's is (see openAIClient.Find). Results are
// matched by custom_id, so adopting a stranger's batch of the same size cannot record a wrong
// result: the jobs missing from its results go round again. (Adopting one of llmq's own,
// already recorded, would leave this batch's real one unread, paid for and its jobs sent again:
// hence taken.)
func (c *anthropicClient) Find(ctx context.Context, _ string, since time.Time, n int, taken func(string) bool) (string, error) {
	oldest := since.Add(-findSkew)
	found, after := "", ""
	for range findMaxPages {
		path := "/v1/messages/batches?limit=100"
		if after != "" {
			path += "&after_id=" + url.QueryEscape(after)
		}
		var page struct {
			Data    []anthropicBatch `json:"data"`
			HasMore bool             `json:"has_more"`
		}
		if err := c.doJSON(ctx, "GET", path, nil, &page); err != nil {
			return "", fmt.Errorf("list message batches: %w", err)
		}
		for _, b := range page.Data {
			if b.CreatedAt.Before(oldest) {
				return found, nil // the rest are older still
			}
			total := 0
			for _, v := range b.RequestCounts {
				total += v
			}
			if total == n && !taken(b.ID) {
				found = b.ID
			}
		}
		if !page.HasMore || len(page.Data) == 0 {
			return found, nil
		}
		after = page.Data[len(page.Data)-1].ID
	}
	return "", fmt.Errorf("list message batches: more than %d created since %s", findMaxPages*100, since.UTC().Format(time.RFC3339))
}

func (c *anthropicClient) Poll(ctx context.Context, id string) (State, error) {
	var b anthropicBatch
	if err := c.doJSON(ctx, "GET", "/v1/messages/batches/"+url.PathEscape(id), nil, &b); err != nil {
		return State{}, fmt.Errorf("retrieve message batch: %w", err)
	}
	return State{Provider: b.ProcessingStatus, Ended: b.ProcessingStatus == "ended"}, nil
}

func (c *anthropicClient) Results(ctx context.Context, id string) ([]Result, error) {
	data, err := c.do(ctx, "GET", "/v1/messages/batches/"+url.PathEscape(id)+"/results", "", nil)
	if err != nil {
		return nil, fmt.Errorf("message batch results: %w", err)
	}
	if c.cutShort(data) {
		return nil, fmt.Errorf("message batch results: %w", errCutShort)
	}
	var out []Result
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 0, 1<<20), 64<<20)
	for sc.Scan() {
		if len(bytes.TrimSpace(sc.Bytes())) == 0 {
			continue
		}
		var line struct {
			CustomID string `json:"custom_id"`
			Result   struct {
				Type    Kind            `json:"type"`
				Message json.RawMessage `json:"message"`
				Error   json.RawMessage `json:"error"`
			} `json:"result"`
		}
		if err := json.Unmarshal(sc.Bytes(), &line); err != nil || line.CustomID == "" {
			// One undecodable line does not hold back the batch's other results: its job,
			// finding no line, goes round again (see record).
			continue
		}
		r := Result{CustomID: line.CustomID, Kind: line.Result.Type}
		switch r.Kind {
		case Succeeded:
			r.Body = line.Result.Message
		case Errored:
			var e struct {
				Error struct{ Type, Message string } `json:"error"`
			}
			_ = json.Unmarshal(line.Result.Error, &e) // an undecodable error is the provider's: 500
			// Its reason is read as an answer's is (error.details.error_code, else error.type):
			// a spend cap is told by its code.
			r.Body, r.ErrorType, r.Message = line.Result.Error, errorTypeOf(line.Result.Error), e.Error.Message
			r.Status = anthropicErrorStatus(e.Error.Type)
			c.cleanError(&r)
		}
		out = append(out, r)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read message batch results: %w", err)
	}
	return out, nil
}

func (c *anthropicClient) Cancel(ctx context.Context, id string) error {
	var b anthropicBatch
	if err := c.doJSON(ctx, "POST", "/v1/messages/batches/"+url.PathEscape(id)+"/cancel", nil, &b); err != nil {
		return fmt.Errorf("cancel message batch: %w", err)
	}
	return nil
}

// DeleteFiles does nothing: a message batch's requests and results are kept with the batch, in
// no file llmq uploads or is given.
func (c *anthropicClient) DeleteFiles(context.Context, []string) error { return nil }

// Uploads lists nothing: a message batch takes no uploaded file.
func (c *anthropicClient) Uploads(context.Context) ([]Upload, error) { return nil, nil }
