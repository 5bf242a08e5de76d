package openapitest_test

import (
	"bytes"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/openapitest"
)

const job = `{"id":"0190a5b2-7c1e-7d3f-9a8b-123456789abc","status":"retrying","credential":"default",
"fallbacks":[],"answered_by":null,"attempt_timeout":null,"first_byte_timeout":null,"idempotency_key":null,
"attempts":1,"max_attempts":5,"timeout":"1m0s","deadline":"2026-12-01T10:00:00Z","created_at":"2026-12-01T09:59:00Z",
"started_at":"2026-12-01T09:59:01Z","finished_at":null,"next_attempt_at":null,
"last_error":{"class":"CLASS","status":503,"message":"overloaded"},"result":null,"usage":null,"dead_reason":null,
"metadata":{"order":"42"},"lane":"online","batch_id":null,"batch_state":null,"cost_class":null,"priority":"normal"}`

func TestSpec_Check(t *testing.T) {
	t.Parallel()
	s := openapitest.Load(t)
	jsonHeader := http.Header{"Content-Type": {"application/json"}}
	stream := http.Header{"Content-Type": {"text/event-stream"}}
	withClass := func(c string) []byte {
		return []byte(strings.ReplaceAll(job, "CLASS", c))
	}
	const id = "/v1/jobs/0190a5b2-7c1e-7d3f-9a8b-123456789abc"
	withLocation := http.Header{"Content-Type": {"application/json"}, "Location": {id}}
	withRetryAfter := func(v string) http.Header {
		return http.Header{"Content-Type": {"application/json"}, "Retry-After": {v}}
	}
	errorBody := []byte(`{"error":{"type":"rate_limited","message":"slow down"}}`)

	for name, tc := range map[string]struct {
		method, path string
		status       int
		header       http.Header
		body         []byte
		ok           bool
	}{
		"Job":            {"GET", id, 200, jsonHeader, withClass("retryable"), true},
		"ClassNeverSent": {"GET", id, 200, jsonHeader, withClass("server_error"), false},
		// Every field but events_url is in every answer (null when unset).
		"JobWithoutAField":       {"GET", id, 200, jsonHeader, []byte(strings.Replace(string(withClass("retryable")), `"batch_id":null,`, "", 1)), false},
		"UndocumentedStatus":     {"GET", id, 418, jsonHeader, []byte(`{"error":{"type":"x","message":"y"}}`), false},
		"Error":                  {"GET", id, 404, jsonHeader, []byte(`{"error":{"type":"not_found","message":"no"}}`), true},
		"ErrorWithoutMessage":    {"GET", id, 404, jsonHeader, []byte(`{"error":{"type":"not_found"}}`), false},
		"WrongContentType":       {"GET", id, 404, http.Header{"Content-Type": {"text/plain"}}, []byte(`x`), false},
		"UnknownPath":            {"GET", "/nope", 404, jsonHeader, []byte(`{"error":{"type":"not_found","message":"no"}}`), true},
		"UnknownPathAnswered200": {"GET", "/nope", 200, jsonHeader, []byte(`{}`), false},
		// A trailing slash names another path, which the server does not serve, and an empty
		// segment is no {id}.
		"TrailingSlash":          {"POST", "/v1/jobs/", 404, jsonHeader, []byte(`{"error":{"type":"not_found","message":"no"}}`), true},
		"TrailingSlashOperation": {"GET", "/healthz/", 404, jsonHeader, []byte(`{"error":{"type":"not_found","message":"no"}}`), true},
		"MethodNotAllowed":       {"PUT", id, 405, http.Header{"Content-Type": {"application/json"}, "Allow": {"DELETE, GET, HEAD"}}, []byte(`{"error":{"type":"method_not_allowed","message":"no"}}`), true},
		"NoContent":              {"GET", id + "/events", 204, http.Header{}, nil, true},
		"NoContentWithBody":      {"GET", id + "/events", 204, http.Header{}, []byte("x"), false},
		"Events":                 {"GET", id + "/events", 200, stream, []byte("event: retrying\nid: 3\ndata: " + string(bytes.ReplaceAll(withClass("retryable"), []byte("\n"), nil)) + "\n\n: keep-alive\n\n"), true},
		"EventDataInvalid":       {"GET", id + "/events", 200, stream, []byte("event: retrying\nid: 3\ndata: " + string(bytes.ReplaceAll(withClass("server_error"), []byte("\n"), nil)) + "\n\n"), false},
		"EventCutShort":          {"GET", id + "/events", 200, stream, []byte("event: retrying\nid: 3\ndata: {\"id"), true},
		// A HEAD's body is not checked (net/http sends none), its status is.
		"Head":                     {"HEAD", id, 200, jsonHeader, withClass("retryable"), true},
		"HeadUndocumentedStatus":   {"HEAD", id, 418, jsonHeader, nil, false},
		"HeadOfEvents":             {"HEAD", id + "/events", 405, http.Header{"Allow": {"GET"}}, nil, true},
		"HeadOfEventsWithoutAllow": {"HEAD", id + "/events", 200, http.Header{}, nil, false},
		"SubmitOpenRequest":        {"POST", "/v1/jobs", 202, withLocation, withClass("timeout"), true},
		// The headers an answer must carry: Location, Retry-After, WWW-Authenticate, ...
		"SubmitWithoutLocation":        {"POST", "/v1/jobs", 202, jsonHeader, withClass("timeout"), false},
		"RateLimited":                  {"POST", "/v1/jobs", 429, withRetryAfter("3"), errorBody, true},
		"RateLimitedWithoutRetryAfter": {"POST", "/v1/jobs", 429, jsonHeader, errorBody, false},
		"RetryAfterNotSeconds":         {"POST", "/v1/jobs", 429, withRetryAfter("soon"), errorBody, false},
		"UnauthorizedWithoutChallenge": {"GET", id, 401, jsonHeader, errorBody, false},
		"HeadUnavailableWithoutRetry":  {"HEAD", id, 503, http.Header{}, nil, false},
		// The console's page is /console/ (a documented trailing slash), its API under it.
		"ConsolePage": {"GET", "/console/", 200, http.Header{"Content-Type": {"text/html; charset=utf-8"}, "Etag": {`"0123456789abcdef0123456789abcdef"`},
			"Cache-Control": {"no-cache"}}, []byte("<!doctype html>"), true},
		// The page's ETag is required (a browser's copy is revalidated with it).
		"ConsolePageWithoutETag": {"GET", "/console/", 200, http.Header{"Content-Type": {"text/html; charset=utf-8"}, "Cache-Control": {"no-cache"}},
			[]byte("<!doctype html>"), false},
		"ConsoleWithoutSlash":  {"GET", "/console", 307, http.Header{"Location": {"/console/"}, "Content-Type": {"text/html; charset=utf-8"}}, []byte("<a href=\"/console/\">Temporary Redirect</a>.\n"), true},
		"ConsoleSession":       {"GET", "/console/api/session", 200, jsonHeader, []byte(`{"operator":"alice","csrf_token":"x","expires_at":"2026-12-01T10:00:00Z"}`), true},
		"ConsoleSessionNoCSRF": {"GET", "/console/api/session", 200, jsonHeader, []byte(`{"operator":"alice","expires_at":"2026-12-01T10:00:00Z"}`), false},
		"ConsoleJobWithTenant": {"GET", "/console/api/jobs", 200, jsonHeader, []byte(`{"jobs":[` + strings.Replace(string(withClass("retryable")), "{",
			`{"tenant":"acme","current_credential":"default",`, 1) + `],"next":""}`), true},
		"ConsoleJobWithoutTenant": {"GET", "/console/api/jobs", 200, jsonHeader, []byte(`{"jobs":[` + string(withClass("retryable")) + `],"next":""}`), false},
		// A Job of the API has no tenant.
		"JobWithTenant": {"GET", id, 200, jsonHeader, []byte(strings.Replace(string(withClass("retryable")), "{", `{"tenant":"acme",`, 1)), false},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			err := s.Check(tc.method, tc.path, tc.status, tc.header, tc.body)
			if tc.ok {
				require.NoError(t, err)
			} else {
				require.Error(t, err)
				t.Log(err)
			}
		})
	}
}
