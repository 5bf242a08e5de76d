package llmsim_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/openai/openai-go/v3"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/llmsim"
)

// batchSim is a simulator whose batches take an hour on its fake clock.
func batchSim(t *testing.T) *testBundle {
	return setup(t, llmsim.Config{Batch: llmsim.BatchConfig{ProcessingDelay: time.Hour},
		Faults: llmsim.Faults{BadRequestMarker: "llmsim-bad-request"}})
}

func anthropicBatchRequest(id, text string) anthropic.MessageBatchNewParamsRequest {
	return anthropic.MessageBatchNewParamsRequest{CustomID: id, Params: anthropic.MessageBatchNewParamsRequestParams{
		Model: "claude-sim", MaxTokens: 64,
		Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock(text))}}}
}

// TestSDK_AnthropicBatches: the official SDK creates, retrieves, lists and cancels Message
// Batches on the simulator and reads their results, one per custom_id, with each outcome:
// succeeded (a Message), errored (invalid request, overloaded), expired and canceled. Time is
// the fake clock's: nothing waits.
func TestSDK_AnthropicBatches(t *testing.T) {
	t.Parallel()
	b := batchSim(t)
	c := b.anthropicClient("sk-ant-test").Messages.Batches
	ctx := t.Context()

	batch, err := c.New(ctx, anthropic.MessageBatchNewParams{Requests: []anthropic.MessageBatchNewParamsRequest{
		anthropicBatchRequest("ok", "hello"),
		anthropicBatchRequest("bad", "llmsim-bad-request"),
		anthropicBatchRequest("busy", "llmsim-batch-overloaded"),
		anthropicBatchRequest("late", "llmsim-batch-expire"),
	}})
	require.NoError(t, err)
	require.True(t, strings.HasPrefix(batch.ID, "msgbatch_"))
	require.Equal(t, anthropic.MessageBatchProcessingStatusInProgress, batch.ProcessingStatus)
	require.EqualValues(t, 4, batch.RequestCounts.Processing)

	b.clock.Advance(59 * time.Minute)
	got, err := c.Get(ctx, batch.ID, anthropic.MessageBatchGetParams{})
	require.NoError(t, err)
	require.Equal(t, anthropic.MessageBatchProcessingStatusInProgress, got.ProcessingStatus, "not before its processing delay")

	b.clock.Advance(time.Minute)
	got, err = c.Get(ctx, batch.ID, anthropic.MessageBatchGetParams{})
	require.NoError(t, err)
	require.Equal(t, anthropic.MessageBatchProcessingStatusEnded, got.ProcessingStatus)
	require.EqualValues(t, 1, got.RequestCounts.Succeeded)
	require.EqualValues(t, 2, got.RequestCounts.Errored)
	require.EqualValues(t, 1, got.RequestCounts.Expired)
	require.NotEmpty(t, got.ResultsURL)

	stream := c.ResultsStreaming(ctx, batch.ID, anthropic.MessageBatchResultsParams{})
	results := map[string]anthropic.MessageBatchIndividualResponse{}
	for stream.Next() {
		results[stream.Current().CustomID] = stream.Current()
	}
	require.NoError(t, stream.Err())
	require.Len(t, results, 4)
	require.Equal(t, "succeeded", results["ok"].Result.Type)
	require.Equal(t, "message", string(results["ok"].Result.Message.Type))
	require.Positive(t, results["ok"].Result.Message.Usage.OutputTokens)
	require.Equal(t, "errored", results["bad"].Result.Type)
	require.Equal(t, "invalid_request_error", results["bad"].Result.Error.Error.Type)
	require.Equal(t, "errored", results["busy"].Result.Type)
	require.Equal(t, "overloaded_error", results["busy"].Result.Error.Error.Type)
	require.Equal(t, "expired", results["late"].Result.Type)

	// Cancel: every request not yet processed ends canceled.
	second, err := c.New(ctx, anthropic.MessageBatchNewParams{Requests: []anthropic.MessageBatchNewParamsRequest{anthropicBatchRequest("x", "hi")}})
	require.NoError(t, err)
	canceled, err := c.Cancel(ctx, second.ID, anthropic.MessageBatchCancelParams{})
	require.NoError(t, err)
	require.Equal(t, anthropic.MessageBatchProcessingStatusEnded, canceled.ProcessingStatus)
	require.EqualValues(t, 1, canceled.RequestCounts.Canceled)

	page, err := c.List(ctx, anthropic.MessageBatchListParams{})
	require.NoError(t, err)
	require.Len(t, page.Data, 2)
	require.Equal(t, second.ID, page.Data[0].ID, "newest first")

	_, err = c.Get(ctx, "msgbatch_nope", anthropic.MessageBatchGetParams{})
	var apiErr *anthropic.Error
	require.ErrorAs(t, err, &apiErr)
	require.Equal(t, 404, apiErr.StatusCode)
}

// TestAnthropicBatches_WindowExpiry: a batch the provider cannot end within its window ends
// there with every request expired.
func TestAnthropicBatches_WindowExpiry(t *testing.T) {
	t.Parallel()
	b := setup(t, llmsim.Config{Batch: llmsim.BatchConfig{ProcessingDelay: 25 * time.Hour}})
	c := b.anthropicClient("sk-ant-test").Messages.Batches
	batch, err := c.New(t.Context(), anthropic.MessageBatchNewParams{Requests: []anthropic.MessageBatchNewParamsRequest{
		anthropicBatchRequest("a", "hi"), anthropicBatchRequest("b", "hi")}})
	require.NoError(t, err)
	b.clock.Advance(24 * time.Hour)
	got, err := c.Get(t.Context(), batch.ID, anthropic.MessageBatchGetParams{})
	require.NoError(t, err)
	require.Equal(t, anthropic.MessageBatchProcessingStatusEnded, got.ProcessingStatus)
	require.EqualValues(t, 2, got.RequestCounts.Expired)
}

// TestSDK_OpenAIBatches: the official SDK uploads a JSONL input file, creates a batch with
// metadata, retrieves, lists and cancels it, and reads the output and error files: the
// succeeded and errored requests with their responses by custom_id, the expired ones with
// batch_expired.
func TestSDK_OpenAIBatches(t *testing.T) {
	t.Parallel()
	b := batchSim(t)
	c := b.openaiClient("sk-test")
	ctx := t.Context()
	line := func(id, text string) string {
		return `{"custom_id":"` + id + `","method":"POST","url":"/v1/chat/completions","body":{"model":"gpt-sim","messages":[{"role":"user","content":"` + text + `"}]}}` + "\n"
	}
	input := line("ok", "hello") + line("bad", "llmsim-bad-request") + line("busy", "llmsim-batch-overloaded") + line("late", "llmsim-batch-expire")
	file, err := c.Files.New(ctx, openai.FileNewParams{File: openai.File(strings.NewReader(input), "in.jsonl", "application/jsonl"),
		Purpose: openai.FilePurposeBatch})
	require.NoError(t, err)
	batch, err := c.Batches.New(ctx, openai.BatchNewParams{InputFileID: file.ID, Endpoint: openai.BatchNewParamsEndpointV1ChatCompletions,
		CompletionWindow: openai.BatchNewParamsCompletionWindow24h, Metadata: map[string]string{"llmq_batch": "b1"}})
	require.NoError(t, err)
	require.Equal(t, openai.BatchStatusInProgress, batch.Status)
	require.EqualValues(t, 4, batch.RequestCounts.Total)

	b.clock.Advance(time.Hour)
	got, err := c.Batches.Get(ctx, batch.ID)
	require.NoError(t, err)
	require.Equal(t, openai.BatchStatusCompleted, got.Status)
	require.Equal(t, "b1", got.Metadata["llmq_batch"])
	require.NotEmpty(t, got.OutputFileID)
	require.NotEmpty(t, got.ErrorFileID)

	lines := func(id string) map[string]map[string]any {
		resp, err := c.Files.Content(ctx, id)
		require.NoError(t, err)
		defer resp.Body.Close()
		data, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		out := map[string]map[string]any{}
		sc := bufio.NewScanner(strings.NewReader(string(data)))
		for sc.Scan() {
			var l map[string]any
			require.NoError(t, json.Unmarshal(sc.Bytes(), &l))
			out[l["custom_id"].(string)] = l
		}
		return out
	}
	out := lines(got.OutputFileID)
	require.Len(t, out, 1)
	var completion openai.ChatCompletion
	body, _ := json.Marshal(out["ok"]["response"].(map[string]any)["body"])
	require.NoError(t, json.Unmarshal(body, &completion))
	require.Equal(t, "chat.completion", string(completion.Object))
	require.Positive(t, completion.Usage.CompletionTokens)

	errs := lines(got.ErrorFileID)
	require.Len(t, errs, 3)
	require.EqualValues(t, 400, errs["bad"]["response"].(map[string]any)["status_code"])
	require.EqualValues(t, 503, errs["busy"]["response"].(map[string]any)["status_code"])
	require.Equal(t, "batch_expired", errs["late"]["error"].(map[string]any)["code"])

	second, err := c.Batches.New(ctx, openai.BatchNewParams{InputFileID: file.ID, Endpoint: openai.BatchNewParamsEndpointV1ChatCompletions,
		CompletionWindow: openai.BatchNewParamsCompletionWindow24h})
	require.NoError(t, err)
	canceled, err := c.Batches.Cancel(ctx, second.ID)
	require.NoError(t, err)
	require.Equal(t, openai.BatchStatusCancelled, canceled.Status)

	page, err := c.Batches.List(ctx, openai.BatchListParams{})
	require.NoError(t, err)
	require.Len(t, page.Data, 2)
	require.Equal(t, second.ID, page.Data[0].ID, "newest first")

	st := b.sim.BatchStats()
	require.Equal(t, 2, st.Created)
	require.Equal(t, 1, st.Uploads)
	require.Equal(t, 1, st.Succeeded)
}

// TestSDK_OpenAIBatchListPages: GET /v1/batches answers a page as OpenAI does (limit, 20 by
// default, at most 100; after, the id the page starts after; has_more), so that the SDK's
// auto-pager reads every batch newest first. Before, every batch came in one page whatever the
// limit: a client that read one page of 100 saw them all here, and not at OpenAI.
func TestSDK_OpenAIBatchListPages(t *testing.T) {
	t.Parallel()
	b := batchSim(t)
	c := b.openaiClient("sk-test")
	ctx := t.Context()
	input := `{"custom_id":"a","method":"POST","url":"/v1/chat/completions","body":{"model":"gpt-sim","messages":[{"role":"user","content":"hi"}]}}` + "\n"
	file, err := c.Files.New(ctx, openai.FileNewParams{File: openai.File(strings.NewReader(input), "in.jsonl", "application/jsonl"),
		Purpose: openai.FilePurposeBatch})
	require.NoError(t, err)
	var ids []string // newest first
	for range 25 {
		batch, err := c.Batches.New(ctx, openai.BatchNewParams{InputFileID: file.ID, Endpoint: openai.BatchNewParamsEndpointV1ChatCompletions,
			CompletionWindow: openai.BatchNewParamsCompletionWindow24h})
		require.NoError(t, err)
		ids = append([]string{batch.ID}, ids...)
	}

	page, err := c.Batches.List(ctx, openai.BatchListParams{})
	require.NoError(t, err)
	require.Len(t, page.Data, 20, "20 by default")
	require.True(t, page.HasMore)
	page, err = c.Batches.List(ctx, openai.BatchListParams{Limit: openai.Int(10), After: openai.String(ids[19])})
	require.NoError(t, err)
	require.Len(t, page.Data, 5)
	require.False(t, page.HasMore)
	require.Equal(t, ids[20], page.Data[0].ID)

	var listed []string
	iter := c.Batches.ListAutoPaging(ctx, openai.BatchListParams{Limit: openai.Int(7)})
	for iter.Next() {
		listed = append(listed, iter.Current().ID)
	}
	require.NoError(t, iter.Err())
	require.Equal(t, ids, listed)

	_, err = c.Batches.List(ctx, openai.BatchListParams{Limit: openai.Int(101)})
	var apiErr *openai.Error
	require.ErrorAs(t, err, &apiErr)
	require.Equal(t, 400, apiErr.StatusCode)

	// The input file can be deleted (its batches keep their requests).
	deleted, err := c.Files.Delete(ctx, file.ID)
	require.NoError(t, err)
	require.True(t, deleted.Deleted)
	_, err = c.Files.Delete(ctx, file.ID)
	require.ErrorAs(t, err, &apiErr)
	require.Equal(t, 404, apiErr.StatusCode)
	require.Equal(t, 1, b.sim.BatchStats().Deletes)
}

// TestSDK_AnthropicBatchListPages: GET /v1/messages/batches pages as Anthropic documents it
// (newest first; limit, 20 by default, at most 1000; after_id, the page of older batches right
// after that one; before_id, the page of newer ones right before it; has_more in the direction
// asked), so that the SDK's auto-pager reads every batch either way. Before, before_id was
// ignored: the newest page came back, has_more true, and a pager going toward newer batches
// asked for it again forever.
func TestSDK_AnthropicBatchListPages(t *testing.T) {
	t.Parallel()
	b := batchSim(t)
	c := b.anthropicClient("sk-ant-test").Messages.Batches
	ctx := t.Context()
	var ids []string // newest first
	for i := range 25 {
		batch, err := c.New(ctx, anthropic.MessageBatchNewParams{Requests: []anthropic.MessageBatchNewParamsRequest{
			anthropicBatchRequest(fmt.Sprintf("r%d", i), "hello")}})
		require.NoError(t, err)
		ids = append([]string{batch.ID}, ids...)
	}

	page, err := c.List(ctx, anthropic.MessageBatchListParams{})
	require.NoError(t, err)
	require.Len(t, page.Data, 20, "20 by default")
	require.True(t, page.HasMore)
	page, err = c.List(ctx, anthropic.MessageBatchListParams{Limit: anthropic.Int(10), AfterID: anthropic.String(ids[19])})
	require.NoError(t, err)
	require.Len(t, page.Data, 5)
	require.False(t, page.HasMore)
	require.Equal(t, ids[20], page.Data[0].ID)

	page, err = c.List(ctx, anthropic.MessageBatchListParams{Limit: anthropic.Int(3), BeforeID: anthropic.String(ids[10])})
	require.NoError(t, err)
	require.Equal(t, []string{ids[7], ids[8], ids[9]}, []string{page.Data[0].ID, page.Data[1].ID, page.Data[2].ID},
		"the three batches right before (newer than) the cursor, newest first")
	require.True(t, page.HasMore, "newer batches remain")

	var listed []string
	iter := c.ListAutoPaging(ctx, anthropic.MessageBatchListParams{Limit: anthropic.Int(7)})
	for iter.Next() {
		listed = append(listed, iter.Current().ID)
	}
	require.NoError(t, iter.Err())
	require.Equal(t, ids, listed)

	// Toward newer batches from the oldest: the pages come newest first within each, nearest first.
	var newer []string
	iter = c.ListAutoPaging(ctx, anthropic.MessageBatchListParams{Limit: anthropic.Int(7), BeforeID: anthropic.String(ids[24])})
	for iter.Next() && len(newer) <= len(ids) {
		newer = append(newer, iter.Current().ID)
	}
	require.NoError(t, iter.Err())
	require.ElementsMatch(t, ids[:24], newer)

	_, err = c.List(ctx, anthropic.MessageBatchListParams{Limit: anthropic.Int(1001)})
	var apiErr *anthropic.Error
	require.ErrorAs(t, err, &apiErr)
	require.Equal(t, 400, apiErr.StatusCode)
}

// TestSDK_OpenAIFileDeleteErrorMarker: a file whose content holds BatchConfig.DeleteErrorMarker
// cannot be deleted (500 server_error, every time; the file is kept), so that a client's retries
// of a failed delete can be tested; another file deletes as before.
func TestSDK_OpenAIFileDeleteErrorMarker(t *testing.T) {
	t.Parallel()
	b := batchSim(t)
	c := b.openaiClient("sk-test")
	ctx := t.Context()
	upload := func(text string) string {
		input := `{"custom_id":"a","method":"POST","url":"/v1/chat/completions","body":{"model":"gpt-sim","messages":[{"role":"user","content":"` +
			text + `"}]}}` + "\n"
		file, err := c.Files.New(ctx, openai.FileNewParams{File: openai.File(strings.NewReader(input), "in.jsonl", "application/jsonl"),
			Purpose: openai.FilePurposeBatch})
		require.NoError(t, err)
		return file.ID
	}
	stuck, other := upload("llmsim-batch-delete-error"), upload("hi")
	for range 2 {
		_, err := c.Files.Delete(ctx, stuck)
		var apiErr *openai.Error
		require.ErrorAs(t, err, &apiErr)
		require.Equal(t, 500, apiErr.StatusCode)
	}
	_, err := c.Files.Content(ctx, stuck)
	require.NoError(t, err, "the file is kept")
	deleted, err := c.Files.Delete(ctx, other)
	require.NoError(t, err)
	require.True(t, deleted.Deleted)
	require.Equal(t, 1, b.sim.BatchStats().Deletes)
}

// TestSDK_OpenAIFileListPages: GET /v1/files answers as OpenAI does (purpose, limit, order
// newest first by default, after, has_more, and each file's filename), so that the SDK's
// auto-pager reads the batch input files either way, and a deleted file is not listed.
func TestSDK_OpenAIFileListPages(t *testing.T) {
	t.Parallel()
	b := batchSim(t)
	c := b.openaiClient("sk-test")
	ctx := t.Context()
	var ids []string // oldest first
	for i := range 5 {
		f, err := c.Files.New(ctx, openai.FileNewParams{File: openai.File(strings.NewReader("{}\n"), fmt.Sprintf("in-%d.jsonl", i),
			"application/jsonl"), Purpose: openai.FilePurposeBatch})
		require.NoError(t, err)
		ids = append(ids, f.ID)
	}

	page, err := c.Files.List(ctx, openai.FileListParams{Purpose: openai.String("batch"), Limit: openai.Int(2)})
	require.NoError(t, err)
	require.Len(t, page.Data, 2)
	require.True(t, page.HasMore)
	require.Equal(t, ids[4], page.Data[0].ID, "newest first")
	require.Equal(t, "in-4.jsonl", page.Data[0].Filename)

	_, err = c.Files.Delete(ctx, ids[2])
	require.NoError(t, err)
	var listed []string
	iter := c.Files.ListAutoPaging(ctx, openai.FileListParams{Purpose: openai.String("batch"), Limit: openai.Int(2),
		Order: openai.FileListParamsOrderAsc})
	for iter.Next() {
		listed = append(listed, iter.Current().ID)
	}
	require.NoError(t, iter.Err())
	require.Equal(t, []string{ids[0], ids[1], ids[3], ids[4]}, listed)

	page, err = c.Files.List(ctx, openai.FileListParams{Purpose: openai.String("batch_output")})
	require.NoError(t, err)
	require.Empty(t, page.Data, "no batch has ended")
}
