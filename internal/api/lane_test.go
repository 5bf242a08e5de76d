package api

import (
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/require"
)

// TestSubmit_Lane: the submit body's lane. batch and auto (with room for the window) store a
// batch-lane job that is waiting for a batch and has no asynq task (the batcher collects it, so
// it takes no online limiter slot); online is the default; a bad value or a credential without a
// batch lane is a 400 naming the problem, and nothing is stored.
func TestSubmit_Lane(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{credentials: []string{"default", "plain"},
		batchWindows: map[string]time.Duration{"default": time.Hour}})
	const req = `"request":{"model":"m","max_tokens":8,"messages":[]}`

	for _, tc := range []struct {
		name, body, lane string
		batchState       any
	}{
		{"Default", `{` + req + `}`, "online", nil},
		{"Online", `{"lane":"online",` + req + `}`, "online", nil},
		{"Batch", `{"lane":"batch",` + req + `}`, "batch", "waiting"},
		{"AutoWithRoom", `{"lane":"auto","timeout":"1h",` + req + `}`, "batch", "waiting"},
		{"AutoWithoutRoom", `{"lane":"auto","timeout":"59m",` + req + `}`, "online", nil},
		{"AutoWithoutBatches", `{"lane":"auto","credential":"plain","timeout":"24h",` + req + `}`, "online", nil},
		{"BatchLongAttempt", `{"lane":"batch","attempt_timeout":"30m",` + req + `}`, "batch", "waiting"},
		// A streaming request wants its answer as it is written: auto sends it online.
		{"AutoStreaming", `{"lane":"auto","timeout":"1h","request":{"model":"m","max_tokens":8,"stream":true,"messages":[]}}`, "online", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := b.do(t, "POST", "/v1/jobs", tc.body, nil)
			require.Equal(t, 202, r.status, "%v", r.body)
			require.Equal(t, tc.lane, r.body["lane"])
			require.Equal(t, tc.batchState, r.body["batch_state"])
			require.Nil(t, r.body["batch_id"])
			require.Nil(t, r.body["cost_class"])
			_, err := b.inspector.GetTaskInfo(b.queue, r.body["id"].(string))
			if tc.lane == "batch" {
				require.ErrorIs(t, err, asynq.ErrTaskNotFound, "a batch-lane job is never enqueued")
			} else {
				require.NoError(t, err, "an online job is enqueued")
			}
			got := b.do(t, "GET", "/v1/jobs/"+r.body["id"].(string), "", nil)
			require.Equal(t, tc.lane, got.body["lane"])
			if tc.name == "Batch" {
				require.Equal(t, "1h0m0s", got.body["timeout"], "a batch job without a timeout gets the window")
			}
		})
	}

	for _, tc := range []struct{ name, body, typ, msg string }{
		{"BadLane", `{"lane":"later",` + req + `}`, "invalid_lane", `lane "later" must be "online", "batch" or "auto"`},
		// A long value is quoted cut short, as a priority's is.
		{"LongLane", `{"lane":"` + strings.Repeat("x", 100000) + `",` + req + `}`, "invalid_lane", `must be "online", "batch" or "auto"`},
		{"CaseLane", `{"lane":"Batch",` + req + `}`, "invalid_lane", `lane "Batch" must be`},
		{"NotAString", `{"lane":1,` + req + `}`, "invalid_field", `"lane"`},
		{"NoBatchLane", `{"lane":"batch","credential":"plain",` + req + `}`, "batch_unavailable", `credential "plain" has no batch lane`},
		{"StreamingBatch", `{"lane":"batch","request":{"model":"m","max_tokens":8,"stream":true,"messages":[]}}`, "stream_in_batch", `cannot go through a batch API`},
		// "\u0073tream" is "stream" to the provider (and to llm's Send, which streams it), but not to
		// deltastream.Requested's byte search: it went to the batch lane, never streamed.
		{"StreamingBatchEscaped", `{"lane":"batch","request":{"model":"m","max_tokens":8,"\u0073tream":true,"messages":[]}}`, "invalid_request", `field "request.stream" must be spelled "stream"`},
		{"StreamingAutoEscaped", `{"lane":"auto","timeout":"2h","request":{"model":"m","max_tokens":8,"\u0073tream":true,"messages":[]}}`, "invalid_request", `field "request.stream" must be spelled "stream"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := b.do(t, "POST", "/v1/jobs", tc.body, nil)
			require.Equal(t, 400, r.status, "%v", r.body)
			e := r.body["error"].(map[string]any)
			require.Equal(t, tc.typ, e["type"])
			require.Contains(t, e["message"], tc.msg)
			require.Less(t, len(e["message"].(string)), 200, "the message quotes a long value cut short")
		})
	}
}
