package console

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"net/url"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/llmq/llmq/internal/audit"
	"github.com/llmq/llmq/internal/eventsource"
	"github.com/llmq/llmq/internal/jobs"
	"github.com/llmq/llmq/internal/pgwait"
	"github.com/llmq/llmq/internal/tenant"
)

// apiError is an error with its HTTP answer: {"error":{"type","message"}}, as the API's.
type apiError struct {
	status  int
	typ     string
	message string
	// header is set on the answer (a 503's Retry-After), when not nil.
	header http.Header
}

func (e *apiError) Error() string { return e.message }

func badRequest(typ, msg string) *apiError {
	return &apiError{status: http.StatusBadRequest, typ: typ, message: msg}
}

// checkFilter refuses (400) a filter value Postgres cannot hold as text: not UTF-8, or holding
// NUL. It names nothing stored, and as a query's parameter it would fail the query (a 500).
func checkFilter(name, v string) error {
	if !utf8.ValidString(v) || strings.ContainsRune(v, 0) {
		return badRequest("invalid_filter", name+" must be UTF-8 text without NUL")
	}
	return nil
}

// checkParams refuses (400 invalid_parameter) a query parameter that is not one of allowed, or
// one given more than once: ignored, the first would answer the unfiltered list as if it were the
// filtered one (ctl's --since on the dead letters, a misspelt filter), and the second would keep
// one of the values silently.
func checkParams(q url.Values, allowed ...string) error {
	for _, name := range slices.Sorted(maps.Keys(q)) {
		if !slices.Contains(allowed, name) {
			return badRequest("invalid_parameter", fmt.Sprintf("unknown parameter %q: this list takes %s",
				name, strings.Join(allowed, ", ")))
		}
		if len(q[name]) > 1 {
			return badRequest("invalid_parameter", fmt.Sprintf("parameter %q is given %d times: give it once", name, len(q[name])))
		}
	}
	return nil
}

// queryLimit reads a list's limit from q (checked by checkParams: given once at most): given
// reports whether it was, and a value that is not a number from 1 to most (empty too: no
// default is read into it) is 400 invalid_limit, naming the value.
func queryLimit(q url.Values, most int) (n int, given bool, err error) {
	vs, given := q["limit"]
	if !given {
		return 0, false, nil
	}
	n, convErr := strconv.Atoi(vs[0])
	if convErr != nil || n < 1 || n > most {
		return 0, true, badRequest("invalid_limit", fmt.Sprintf("limit %q: must be a number from 1 to %d", vs[0], most))
	}
	return n, true, nil
}

// writeError is the console's one table from errors to statuses. A client's mistake (unknown
// id, stale cursor, bad name) is a 4xx naming it; only a failure of ours is a 500, logged.
func writeError(w http.ResponseWriter, r *http.Request, logger *slog.Logger, err error) {
	if ae := errorAnswer(r, logger, err); ae != nil {
		setHeader(w, ae)
		writeJSON(w, ae.status, map[string]any{"error": map[string]string{"type": ae.typ, "message": ae.message}})
	}
}

// errorAnswer is writeError's answer to err, logged when it is the database's failure or ours;
// nil when the client left (nothing to answer).
func errorAnswer(r *http.Request, logger *slog.Logger, err error) *apiError {
	var ae *apiError
	switch {
	case errors.As(err, &ae):
	case errors.Is(err, jobs.ErrNotFound):
		ae = &apiError{status: http.StatusNotFound, typ: "not_found", message: "no job with that id (it may have been purged)"}
	case errors.Is(err, jobs.ErrBadCursor), errors.Is(err, audit.ErrBadCursor):
		ae = badRequest("stale_page", "this page link is stale or malformed; start again from the first page")
	case errors.Is(err, tenant.ErrInvalidName):
		ae = badRequest("invalid_name", err.Error())
	case errors.Is(err, tenant.ErrDuplicateCredential):
		ae = badRequest("duplicate_credential", err.Error())
	case errors.Is(err, tenant.ErrInvalidWeight):
		ae = badRequest("invalid_weight", err.Error())
	case errors.Is(err, tenant.ErrExists):
		ae = &apiError{status: http.StatusConflict, typ: "tenant_exists", message: err.Error()}
	case errors.Is(err, tenant.ErrRevoked):
		ae = &apiError{status: http.StatusConflict, typ: "tenant_revoked", message: err.Error()}
	case errors.Is(err, tenant.ErrHasJobs):
		// A job committed between the count of the tenant's jobs and its deletion: delete again.
		ae = &apiError{status: http.StatusConflict, typ: "tenant_has_jobs", message: err.Error() + ": delete it again"}
	case errors.Is(err, tenant.ErrNotFound):
		ae = &apiError{status: http.StatusNotFound, typ: "not_found", message: err.Error()}
	case errors.Is(err, jobs.ErrBusy):
		// As the API's DELETE answers it: not our failure, nor a final answer (a 409 would
		// read as one): the job was retried and ended again under each of the cancel's tries,
		// nothing was done, and the next try likely takes.
		ae = &apiError{status: http.StatusServiceUnavailable, typ: "job_busy",
			message: "the job's status kept changing under the cancel (an operator retrying it); nothing was done; retry shortly",
			header:  http.Header{"Retry-After": {"1"}}}
	case errors.Is(err, context.Canceled):
		return nil // the client left
	case timedOut(r.Context(), err):
		// An action cut at ActionTimeout (api.store_timeout), a statement at the server's
		// statement_timeout or lock_timeout, a pool connection that did not come free: Postgres
		// was there and slow (a lock a long transaction holds, an I/O stall, a failover), which
		// "unreachable" sent an operator looking for a network fault.
		logger.WarnContext(r.Context(), "console: store timed out", "path", r.URL.Path, "error", err)
		ae = &apiError{status: http.StatusServiceUnavailable, typ: "unavailable", message: "the database did not answer in time (a lock a long transaction holds, or a slow or failing-over server); try again shortly"}

	case jobs.IsUnavailable(err):
		logger.WarnContext(r.Context(), "console: store unavailable", "path", r.URL.Path, "error", err)
		ae = &apiError{status: http.StatusServiceUnavailable, typ: "unavailable", message: "the database is unreachable; try again shortly"}
	default:
		logger.ErrorContext(r.Context(), "console: internal error", "method", r.Method, "path", r.URL.Path, "error", err)
		ae = &apiError{status: http.StatusInternalServerError, typ: "internal", message: "internal error (logged)"}
	}
	return ae
}

// liveRetryAfter is how long a live page's EventSource refused for a reason that passes waits
// before it comes back, at most (refuseStream): the API's Retry-After of an unavailable store.
const liveRetryAfter = 5 * time.Second

// refuseStream answers a live page's stream that failed before its first event with err:
// writeError's answer, but for a 503 (the database unreachable or past its bound, the
// credential lookups full: what passes) to a client that takes event streams (Accept:
// text/event-stream, which every EventSource sends), which is told to come back instead
// (eventsource.Refuse: a 200 event stream holding a retry field, a full-jitter draw below the
// Retry-After, or liveRetryAfter) and then reconnects by itself, as the API's event streams
// tell it: a 503 ended the EventSource for good, and the page opened it again only after its
// fixed reopen delay and a read of its own, every page refused together. The caps
// (api.max_streams: openStream) keep their 503.
func (h *Handler) refuseStream(w http.ResponseWriter, r *http.Request, err error) {
	ae := errorAnswer(r, h.cfg.Logger, err)
	if ae == nil {
		return
	}
	setHeader(w, ae)
	if ae.status != http.StatusServiceUnavailable || !eventsource.Accepts(r) {
		writeJSON(w, ae.status, map[string]any{"error": map[string]string{"type": ae.typ, "message": ae.message}})
		return
	}
	retryAfter, convErr := strconv.Atoi(w.Header().Get("Retry-After"))
	if convErr != nil || retryAfter <= 0 {
		retryAfter = int(liveRetryAfter / time.Second)
	}
	w.Header().Set("Cache-Control", "no-store")
	eventsource.Refuse(w, ae.typ, ae.message, retryAfter, h.retryRand())
}

// setHeader sets ae's header on w's answer.
func setHeader(w http.ResponseWriter, ae *apiError) {
	for k, v := range ae.header {
		w.Header()[k] = v
	}
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// maxBodyBytes caps an action's body: its JSON is a handful of fields.
const maxBodyBytes = 1 << 20

// readJSON decodes a small JSON body into v: 400 naming the problem otherwise, 413 past
// maxBodyBytes, 408 when the body did not arrive within the server's read timeout.
func readJSON(r *http.Request, v any) error {
	dec := json.NewDecoder(http.MaxBytesReader(nil, r.Body, maxBodyBytes))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		if ae := readRefusal(err); ae != nil {
			return ae
		}
		var typ *json.UnmarshalTypeError
		switch {
		case errors.As(err, &typ) && typ.Field == "":
			return badRequest("invalid_body", "the request body must be a JSON object of this action, not "+
				withArticle(strings.SplitN(typ.Value, " ", 2)[0]))
		case errors.As(err, &typ):
			return badRequest("invalid_body", fmt.Sprintf("field %q of the request body: %s where %s belongs",
				typ.Field, withArticle(strings.SplitN(typ.Value, " ", 2)[0]), withArticle(jsonKind(typ.Type))))
		}
		return badRequest("invalid_body", "the request body must be a JSON object of this action: "+err.Error())
	}
	if err := dec.Decode(&struct{}{}); err != io.EOF {
		if ae := readRefusal(err); ae != nil {
			return ae
		}
		return badRequest("invalid_body", "the request body must be one JSON object, with nothing after it")
	}
	return nil
}

// readRefusal is the answer to a body whose read failed with err, not for its JSON: 413 past
// maxBodyBytes, 408 past the server's read timeout; nil for any other err.
func readRefusal(err error) *apiError {
	var mbe *http.MaxBytesError
	var ne net.Error
	switch {
	case errors.As(err, &mbe):
		return &apiError{status: http.StatusRequestEntityTooLarge, typ: "body_too_large",
			message: "the request body exceeds 1 MiB"}
	case errors.As(err, &ne) && ne.Timeout():
		return &apiError{status: http.StatusRequestTimeout, typ: "request_timeout",
			message: "the body did not arrive within the server's read timeout"}
	}
	return nil
}

// jsonKind is the kind of JSON value that decodes into a Go value of type t, in a client's
// words (encoding/json's UnmarshalTypeError names the Go type).
func jsonKind(t reflect.Type) string {
	switch t.Kind() {
	case reflect.Pointer:
		return jsonKind(t.Elem())
	case reflect.String:
		return "string"
	case reflect.Bool:
		return "bool"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "whole number"
	case reflect.Float32, reflect.Float64:
		return "number"
	case reflect.Slice, reflect.Array:
		return "array"
	default:
		return "object"
	}
}

// withArticle is kind, a kind of JSON value as encoding/json or jsonKind names it, with its
// article: "an array", "a boolean".
func withArticle(kind string) string {
	switch kind {
	case "bool":
		return "a boolean"
	case "array", "object":
		return "an " + kind
	default:
		return "a " + kind
	}
}

// timedOut reports whether err is a store call that ran out of time rather than found no
// Postgres: ctx's deadline passed (an action's ActionTimeout), a pool wait's bound
// (pgwait.TimedOut), or the server cut the statement (57014 query_canceled: statement_timeout;
// 55P03 lock_not_available: lock_timeout).
func timedOut(ctx context.Context, err error) bool {
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(ctx.Err(), context.DeadlineExceeded) || pgwait.TimedOut(ctx, err) {
		return true
	}
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && (pgErr.Code == "57014" || pgErr.Code == "55P03")
}
