package api

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/httpserve/httpservetest"
	"github.com/llmq/llmq/internal/jobs"
	"github.com/llmq/llmq/internal/tenant"
)

// TestCancel_AnswersEachState pins a cancel's answer, status and body, for a job in each state,
// whether its tenant has a place free or none (then a cancel with a transition to make is 429,
// TestCancel_EndedJobTakesNoPlace): a live or dead job is canceled (200 and the job as a poll
// then reads it), one that succeeded or failed is 409 job_terminal naming its status, one
// canceled before is 200 and the canceled job, and a missing, malformed or another tenant's ID
// is 404.
func TestCancel_AnswersEachState(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{noListener: true, storeWait: 200 * time.Millisecond})
	notFound := map[string]any{"error": map[string]any{"type": "not_found", "message": "no job with that id"}}
	terminal := func(s string) map[string]any {
		return map[string]any{"error": map[string]any{"type": "job_terminal", "message": "job is " + s}}
	}
	// job makes a job of the default tenant in state s.
	job := func(t *testing.T, s string) string {
		j := b.create(t, "")
		switch s {
		case "queued":
		case "retrying":
			b.attempt(t, j.ID, jobs.Outcome{Status: jobs.StatusRetrying})
		case "running":
			_, err := b.store.BeginAttempt(context.Background(), j.ID)
			require.NoError(t, err)
		case "succeeded":
			b.attempt(t, j.ID, jobs.Outcome{Status: jobs.StatusSucceeded, Result: []byte(`{"x":1}`)})
		case "failed":
			b.attempt(t, j.ID, jobs.Outcome{Status: jobs.StatusFailed,
				LastError: &jobs.LastError{Class: "invalid_request", Status: 400, Message: "bad"}})
		case "dead":
			b.attempt(t, j.ID, jobs.Outcome{Status: jobs.StatusDead, DeadReason: jobs.ReasonRetriesExhausted})
		case "canceled":
			_, err := b.store.Cancel(context.Background(), j.ID)
			require.NoError(t, err)
		default:
			t.Fatalf("no state %q", s)
		}
		return j.ID
	}
	type answer struct {
		status int
		body   map[string]any // nil: the job as a poll reads it after the cancel
	}
	states := []struct {
		name string
		id   func(t *testing.T) string
		want answer
		// live: with no place free, 429 too_many_cancels.
		live bool
	}{
		{"Queued", func(t *testing.T) string { return job(t, "queued") }, answer{http.StatusOK, nil}, true},
		{"Retrying", func(t *testing.T) string { return job(t, "retrying") }, answer{http.StatusOK, nil}, true},
		{"Running", func(t *testing.T) string { return job(t, "running") }, answer{http.StatusOK, nil}, true},
		{"Dead", func(t *testing.T) string { return job(t, "dead") }, answer{http.StatusOK, nil}, true},
		{"Succeeded", func(t *testing.T) string { return job(t, "succeeded") }, answer{http.StatusConflict, terminal("succeeded")}, false},
		{"Failed", func(t *testing.T) string { return job(t, "failed") }, answer{http.StatusConflict, terminal("failed")}, false},
		{"Canceled", func(t *testing.T) string { return job(t, "canceled") }, answer{http.StatusOK, nil}, false},
		{"Missing", func(*testing.T) string { return "0190a5b2-7c1e-7d3f-9a8b-123456789abc" }, answer{http.StatusNotFound, notFound}, false},
		{"Malformed", func(*testing.T) string { return "nope" }, answer{http.StatusNotFound, notFound}, false},
		{"AnotherTenants", func(t *testing.T) string { return b.create(t, "someone-else").ID }, answer{http.StatusNotFound, notFound}, false},
	}
	check := func(t *testing.T, id string, want answer) {
		t.Helper()
		r := b.do(t, http.MethodDelete, "/v1/jobs/"+id, "", nil)
		require.Equal(t, want.status, r.status, "%v", r.body)
		if want.body != nil {
			require.Equal(t, want.body, r.body)
			return
		}
		require.Equal(t, "canceled", r.body["status"])
		polled := b.do(t, http.MethodGet, "/v1/jobs/"+id, "", nil)
		require.Equal(t, http.StatusOK, polled.status)
		require.Equal(t, polled.body, r.body, "the canceled job, as a poll reads it")
	}
	for _, tc := range states {
		t.Run("PlaceFree/"+tc.name, func(t *testing.T) {
			check(t, tc.id(t), tc.want)
		})
	}
	// The tenant's places all held (its keyed submits' and cancels' transactions). Not parallel
	// with the subtests above, which need a place.
	ctx, cancel := context.WithTimeout(context.Background(), httpservetest.Wait)
	defer cancel()
	for range b.srv.keyed.max {
		release, err := b.srv.keyed.enter(ctx, tenant.Default, 0, tooManyCancels)
		require.NoError(t, err)
		defer release()
	}
	for _, tc := range states {
		t.Run("NoPlace/"+tc.name, func(t *testing.T) {
			want := tc.want
			if tc.live {
				want = answer{http.StatusTooManyRequests, nil}
				r := b.do(t, http.MethodDelete, "/v1/jobs/"+tc.id(t), "", nil)
				require.Equal(t, want.status, r.status, "%v", r.body)
				require.Equal(t, "too_many_cancels", r.body["error"].(map[string]any)["type"])
				return
			}
			check(t, tc.id(t), want)
		})
	}
}
