package batchlane

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"mime/multipart"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
)

// openAIClient speaks the Batch API: a JSONL input file (POST /v1/files), POST /v1/batches, and
// the output and error files of an ended batch.
type openAIClient struct{ httpClient }

type openAIBatch struct {
	ID           string            `json:"id"`
	Status       string            `json:"status"`
	InputFileID  string            `json:"input_file_id"`
	OutputFileID *string           `json:"output_file_id"`
	ErrorFileID  *string           `json:"error_file_id"`
	Metadata     map[string]string `json:"metadata"`
	// Errors is why a failed batch failed: one entry per refused input line (Line, 1-based), or
	// one for the whole batch (no line: a quota such as the enqueued token limit).
	Errors *struct {
		Data []struct {
			Code, Message string
			Line          *int `json:"line"`
		} `json:"data"`
	} `json:"errors"`
	// CreatedAt is the batch's creation, in Unix seconds by the provider's clock.
	CreatedAt int64 `json:"created_at"`
}

// metadataKey tags a batch with llmq's batch id, so that Find recognises it after a crash.
const metadataKey = "llmq_batch"

func (c *openAIClient) Submit(ctx context.Context, ref string, reqs []Request, uploaded func(string) error) (string, error) {
	var input bytes.Buffer
	for _, r := range reqs {
		line, err := encodeJSON(map[string]any{"custom_id": r.CustomID, "method": "POST", "url": "/v1/chat/completions", "body": r.Body})
		if err != nil {
			return "", fmt.Errorf("encode batch input line: %w", err)
		}
		input.Write(line)
		input.WriteByte('\n')
	}
	var form bytes.Buffer
	mw := multipart.NewWriter(&form)
	if err := mw.WriteField("purpose", "batch"); err != nil {
		return "", fmt.Errorf("encode batch input file: %w", err)
	}
	fw, err := mw.CreateFormFile("file", uploadName(ref))
	if err == nil {
		_, err = fw.Write(input.Bytes())
	}
	if err == nil {
		err = mw.Close()
	}
	if err != nil {
		return "", fmt.Errorf("encode batch input file: %w", err)
	}
	data, err := c.do(ctx, "POST", "/v1/files", mw.FormDataContentType(), form.Bytes())
	if err != nil {
		return "", fmt.Errorf("upload batch input file: %w", err)
	}
	var file struct {
		ID string `json:"id"`
	}
	if err := json.Unmarshal(data, &file); err != nil || file.ID == "" {
		return "", fmt.Errorf("upload batch input file: answer without a file id")
	}
	if err := uploaded(file.ID); err != nil {
		// Unrecorded, it would be deleted by nobody: deleted now, best effort, and the send
		// fails before the batch is created. The delete outlives ctx (a record cut by the send's
		// end, the worker stopping or the lead lost, is the likeliest failure), within
		// unrecordedDeleteTimeout.
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), unrecordedDeleteTimeout)
		defer cancel()
		_ = c.deleteFile(dctx, file.ID)
		return "", err
	}
	var b openAIBatch
	err = c.doJSON(ctx, "POST", "/v1/batches", map[string]any{"input_file_id": file.ID, "endpoint": "/v1/chat/completions",
		"completion_window": "24h", "metadata": map[string]string{metadataKey: ref}}, &b)
	if se := (*StatusError)(nil); errors.As(err, &se) && se.Status/100 == 4 {
		// Refused, so no batch reads the file: it is deleted, best effort (else every refused
		// send, tried again after each backoff, leaves one more at the provider). A create
		// that failed otherwise (no answer, a 5xx) may have made the batch, which needs it.
		_ = c.deleteFile(ctx, file.ID)
	}
	if err != nil {
		return "", fmt.Errorf("create batch: %w", err)
	}
	return b.ID, nil
}

// uploadName is the name of batch ref's input file, which Uploads reads ref back from.
func uploadName(ref string) string { return uploadPrefix + ref + uploadSuffix }

const (
	uploadPrefix = "llmq-"
	uploadSuffix = ".jsonl"
	// uploadsPageSize is the files one page of Uploads asks for: OpenAI's largest page (and its
	// default).
	uploadsPageSize = 10000
	// uploadsMaxPages bounds the pages one Uploads reads (100,000 files of purpose batch, newest
	// first): the files past it, older, are not listed.
	uploadsMaxPages = 10
)

// Uploads lists the files of purpose batch (GET /v1/files, newest first, a page of 10,000 at a
// time, at most uploadsMaxPages, until has_more is false or a page repeats the last) whose name
// uploadName gave, with the batch ref it carries: a file of another name (uploaded by another
// program with the same key), or whose ref is not a batch id, is left out.
func (c *openAIClient) Uploads(ctx context.Context) ([]Upload, error) {
	var out []Upload
	after := ""
	for range uploadsMaxPages {
		path := "/v1/files?purpose=batch&limit=" + strconv.Itoa(uploadsPageSize)
		if after != "" {
			path += "&after=" + url.QueryEscape(after)
		}
		var page struct {
			Data []struct {
				ID       string `json:"id"`
				Filename string `json:"filename"`
			} `json:"data"`
			HasMore bool `json:"has_more"`
		}
		if err := c.doJSON(ctx, "GET", path, nil, &page); err != nil {
			return out, fmt.Errorf("list batch input files: %w", err)
		}
		for _, f := range page.Data {
			ref, ok := strings.CutPrefix(f.Filename, uploadPrefix)
			ref, ok2 := strings.CutSuffix(ref, uploadSuffix)
			if u, err := uuid.Parse(ref); ok && ok2 && err == nil && u.String() == ref && f.ID != "" {
				out = append(out, Upload{ID: f.ID, Ref: ref})
			}
		}
		// A page that ends where the last one did is the same page again: an endpoint that drops
		// after (a proxy) answers has_more on every page, and would be read uploadsMaxPages times.
		if !page.HasMore || len(page.Data) == 0 || page.Data[len(page.Data)-1].ID == after {
			break
		}
		after = page.Data[len(page.Data)-1].ID
	}
	return out, nil
}

// unrecordedDeleteTimeout bounds the delete of an upload whose record failed (see Submit).
const unrecordedDeleteTimeout = 30 * time.Second

// findSkew is how much earlier than since, by the provider's clock, Find reads batches: the
// send's start is dated by Postgres's clock, the batch's creation by the provider's.
const findSkew = time.Minute

// findMaxPages bounds the pages of 100 batches Find reads (10,000 batches created since the
// send began): past it, Find fails rather than answer "none", which would send the batch again.
const findMaxPages = 100

// Find looks for the batch whose metadata carries ref among the batches created since the send
// began (since, less findSkew), reading the list (newest first) a page of 100 at a time until a
// batch created before that: a key that makes many batches pushes a lost send off the first page
// within the send's claim (sendClaim), and a look-up that missed it would send it again, paid
// twice. A batch without created_at is read past.
func (c *openAIClient) Find(ctx context.Context, ref string, since time.Time, _ int, _ func(string) bool) (string, error) {
	oldest := since.Add(-findSkew).Unix()
	after := ""
	for range findMaxPages {
		path := "/v1/batches?limit=100"
		if after != "" {
			path += "&after=" + url.QueryEscape(after)
		}
		var page struct {
			Data    []openAIBatch `json:"data"`
			HasMore bool          `json:"has_more"`
		}
		if err := c.doJSON(ctx, "GET", path, nil, &page); err != nil {
			return "", fmt.Errorf("list batches: %w", err)
		}
		for _, b := range page.Data {
			if b.Metadata[metadataKey] == ref {
				return b.ID, nil
			}
			if b.CreatedAt != 0 && b.CreatedAt < oldest {
				return "", nil // the rest are older still
			}
		}
		if !page.HasMore || len(page.Data) == 0 {
			return "", nil
		}
		after = page.Data[len(page.Data)-1].ID
	}
	return "", fmt.Errorf("list batches: more than %d created since %s: batch %s not found among them", findMaxPages*100,
		since.UTC().Format(time.RFC3339), ref)
}

func (c *openAIClient) get(ctx context.Context, id string) (openAIBatch, error) {
	var b openAIBatch
	if err := c.doJSON(ctx, "GET", "/v1/batches/"+url.PathEscape(id), nil, &b); err != nil {
		return b, fmt.Errorf("retrieve batch: %w", err)
	}
	return b, nil
}

func (c *openAIClient) Poll(ctx context.Context, id string) (State, error) {
	b, err := c.get(ctx, id)
	if err != nil {
		return State{}, err
	}
	switch b.Status {
	case "completed", "expired", "cancelled":
		return State{Provider: b.Status, Ended: true, Files: b.files()}, nil
	case "failed":
		st := State{Provider: b.Status, Ended: true, Failed: true, Files: b.files()}
		if b.Errors != nil && len(b.Errors.Data) > 0 {
			// Every job of the batch is told its first error, which may name another job's
			// line: the line and the number of errors are kept before the message, where the cut
			// to maxErrorMessageLen does not reach them.
			e, n := b.Errors.Data[0], len(b.Errors.Data)
			var where string
			switch {
			case n > 1 && e.Line != nil:
				where = fmt.Sprintf("%d errors, the first on line %d: ", n, *e.Line)
			case n > 1:
				where = fmt.Sprintf("%d errors, the first: ", n)
			case e.Line != nil:
				where = fmt.Sprintf("line %d: ", *e.Line)
			}
			st.ErrorType, st.Message = c.red.Clean(e.Code, maxErrorTypeLen), c.red.Clean(where+e.Message, maxErrorMessageLen)
		}
		return st, nil
	}
	return State{Provider: b.Status}, nil
}

// Results reads the output file (answers) and the error file (error answers, expired and
// canceled requests). A failed batch has neither (see State.Failed: the batcher reads none).
func (c *openAIClient) Results(ctx context.Context, id string) ([]Result, error) {
	b, err := c.get(ctx, id)
	if err != nil {
		return nil, err
	}
	var out []Result
	for _, f := range []*string{b.OutputFileID, b.ErrorFileID} {
		if f == nil || *f == "" {
			continue
		}
		data, err := c.do(ctx, "GET", "/v1/files/"+url.PathEscape(*f)+"/content", "", nil)
		if err != nil {
			return nil, fmt.Errorf("download batch results file: %w", err)
		}
		if c.cutShort(data) {
			return nil, fmt.Errorf("download batch results file: %w", errCutShort)
		}
		rs, err := c.parseResults(data)
		if err != nil {
			return nil, err
		}
		out = append(out, rs...)
	}
	return out, nil
}

// parseResults reads the lines of an output or error file.
func (c *openAIClient) parseResults(data []byte) ([]Result, error) {
	var out []Result
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 0, 1<<20), 64<<20)
	for sc.Scan() {
		if len(bytes.TrimSpace(sc.Bytes())) == 0 {
			continue
		}
		var line struct {
			CustomID string `json:"custom_id"`
			Response *struct {
				StatusCode int             `json:"status_code"`
				Body       json.RawMessage `json:"body"`
			} `json:"response"`
			Error *struct{ Code, Message string } `json:"error"`
		}
		if err := json.Unmarshal(sc.Bytes(), &line); err != nil || line.CustomID == "" {
			// One undecodable line does not hold back the batch's other results: its job,
			// finding no line, goes round again (see record).
			continue
		}
		r := Result{CustomID: line.CustomID}
		switch {
		case line.Response != nil && line.Response.StatusCode == http.StatusOK:
			r.Kind, r.Body = Succeeded, line.Response.Body
		case line.Response != nil:
			// The body is the endpoint's error answer: its reason is read as the online lane
			// reads one (error.code, else error.type).
			var e struct {
				Error struct{ Message string } `json:"error"`
			}
			_ = json.Unmarshal(line.Response.Body, &e)
			r.Kind, r.Body, r.Status, r.ErrorType, r.Message = Errored, line.Response.Body, line.Response.StatusCode,
				errorTypeOf(line.Response.Body), e.Error.Message
		case line.Error != nil && line.Error.Code == "batch_expired":
			r.Kind = Expired
		case line.Error != nil && line.Error.Code == "batch_cancelled":
			r.Kind = Canceled
		default:
			r.Kind, r.Status = Errored, http.StatusInternalServerError
			if line.Error != nil {
				r.ErrorType, r.Message = line.Error.Code, line.Error.Message
			}
		}
		c.cleanError(&r)
		out = append(out, r)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read batch results file: %w", err)
	}
	return out, nil
}

func (c *openAIClient) Cancel(ctx context.Context, id string) error {
	var b openAIBatch
	if err := c.doJSON(ctx, "POST", "/v1/batches/"+url.PathEscape(id)+"/cancel", nil, &b); err != nil {
		return fmt.Errorf("cancel batch: %w", err)
	}
	return nil
}

// files returns the ids of the batch's input, output and error files that it has.
func (b *openAIBatch) files() []string {
	var out []string
	for _, f := range []*string{&b.InputFileID, b.OutputFileID, b.ErrorFileID} {
		if f != nil && *f != "" {
			out = append(out, *f)
		}
	}
	return out
}

// DeleteFiles deletes each of files (DELETE /v1/files/{id}).
func (c *openAIClient) DeleteFiles(ctx context.Context, files []string) error {
	var errs []error
	for _, f := range files {
		errs = append(errs, c.deleteFile(ctx, f))
	}
	return errors.Join(errs...)
}

// deleteFile deletes file id (DELETE /v1/files/{id}); a file the provider no longer has (404:
// deleted before, or expired) is no error.
func (c *openAIClient) deleteFile(ctx context.Context, id string) error {
	_, err := c.do(ctx, "DELETE", "/v1/files/"+url.PathEscape(id), "", nil)
	if se := (*StatusError)(nil); errors.As(err, &se) && se.Status == http.StatusNotFound {
		return nil
	}
	if err != nil {
		return fmt.Errorf("delete batch file %s: %w", id, err)
	}
	return nil
}
