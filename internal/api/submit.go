package api

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/llmq/llmq/internal/idem"
	"github.com/llmq/llmq/internal/jobs"
	"github.com/llmq/llmq/internal/tokens"
)

// InvalidError is a submission the API must refuse, with 400 unless Status says otherwise; Type
// is a stable machine code and Message names the problem. Nothing is stored for it.
type InvalidError struct {
	// Status is the HTTP status; 0 means 400. Only credential_not_allowed is 403.
	Status  int
	Type    string
	Message string
}

func (e *InvalidError) Error() string { return e.Message }

func invalid(typ, format string, args ...any) error {
	return &InvalidError{Type: typ, Message: fmt.Sprintf(format, args...)}
}

// SubmitConfig holds the submit contract's defaults and limits.
type SubmitConfig struct {
	// Credentials are the names jobs may use.
	Credentials []string
	// Kinds maps credential names to their provider kind; fallbacks must share the primary's.
	// Nil: not checked.
	Kinds map[string]string
	// TokenLimits are the credentials' configured token limits: a request that can never fit
	// one is refused at submit. Missing: not checked (learned limits are checked by the worker).
	TokenLimits map[string]tokens.Limits
	// BatchWindows holds the credentials whose batch lane is enabled, with their batch window
	// (see parseLane). Nil: no batch lane.
	BatchWindows map[string]time.Duration
	// DefaultMaxAttempts applies when the body has no max_attempts. Default 10.
	DefaultMaxAttempts int
	// DefaultTimeout applies when the body has no timeout. Default 10m.
	DefaultTimeout time.Duration
	// MaxTimeout caps a job's timeout. Default 24h.
	MaxTimeout time.Duration
}

// contract decodes and validates submit bodies (POST /v1/jobs, the API's contract) into the jobs
// they describe. It is pure and safe for concurrent use.
type contract struct {
	cfg   SubmitConfig
	creds map[string]bool
}

// newContract returns the contract of cfg; zero fields take their defaults.
func newContract(cfg SubmitConfig) *contract {
	if cfg.DefaultMaxAttempts == 0 {
		cfg.DefaultMaxAttempts = 10
	}
	if cfg.DefaultTimeout == 0 {
		cfg.DefaultTimeout = 10 * time.Minute
	}
	if cfg.MaxTimeout == 0 {
		cfg.MaxTimeout = 24 * time.Hour
	}
	creds := map[string]bool{}
	for _, c := range cfg.Credentials {
		creds[c] = true
	}
	return &contract{cfg: cfg, creds: creds}
}

// submitBody is the POST /v1/jobs body (the contract).
type submitBody struct {
	// Credential is the job's credential; nil (absent or null) means "default".
	Credential *string         `json:"credential"`
	Request    json.RawMessage `json:"request"`
	Timeout    *string         `json:"timeout"`
	// AttemptTimeout and FirstByteTimeout override the credential's per-call limits.
	AttemptTimeout   *string         `json:"attempt_timeout"`
	FirstByteTimeout *string         `json:"first_byte_timeout"`
	MaxAttempts      *integral       `json:"max_attempts"`
	Metadata         json.RawMessage `json:"metadata"`
	// Fallbacks are credentials tried in order after retryable failures on Credential.
	Fallbacks []string `json:"fallbacks"`
	// Lane is "online" (default), "batch" or "auto" (see parseLane).
	Lane *string `json:"lane"`
	// Priority orders the job among its tenant's waiting work: "high", "normal" (default), "low".
	Priority *string `json:"priority"`
}

// integral is a JSON integer as the contract's JSON Schema reads one: a number without a
// fractional part, however written (3, 3.0, 3e0: a client whose numbers are floats sends 3.0).
// Anything else, or a number past ±2^53 (beyond exact), is a *json.UnmarshalTypeError, which
// the decode names the field of (invalid_field).
type integral int64

// maxIntegral bounds an integral: every integer up to it is exact in a float64.
const maxIntegral = 1 << 53

// UnmarshalJSON implements json.Unmarshaler (not called for null: the field stays nil).
func (n *integral) UnmarshalJSON(b []byte) error {
	refuse := func(what string) error {
		return &json.UnmarshalTypeError{Value: what, Type: reflect.TypeFor[int]()}
	}
	if len(b) == 0 || b[0] != '-' && (b[0] < '0' || b[0] > '9') {
		return refuse("non-number " + truncateValue(string(b)))
	}
	f, err := strconv.ParseFloat(string(b), 64)
	if err != nil || f != math.Trunc(f) || math.Abs(f) > maxIntegral {
		return refuse("number " + truncateValue(string(b)))
	}
	*n = integral(f)
	return nil
}

// parsePriority sets the job's priority: absent means normal; anything but the three names is
// invalid_priority.
func parsePriority(raw *string, p *jobs.CreateParams) error {
	p.Priority = jobs.PriorityNormal
	if raw == nil {
		return nil
	}
	if pr := jobs.Priority(*raw); pr.Valid() {
		p.Priority = pr
		return nil
	}
	return invalid("invalid_priority", "priority %q must be \"high\", \"normal\" or \"low\"", truncateValue(*raw))
}

// truncateValue keeps a client's value short enough to quote in an error message, so that
// what the message says after it is not lost to its cap (maxMessageBytes). The cut does not
// split a character.
func truncateValue(s string) string {
	if len(s) <= 40 {
		return s
	}
	cut := 40
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "…"
}

// MaxMetadataBytes caps the metadata object.
const MaxMetadataBytes = 16 << 10

// minDuration is the shortest timeout a job may ask for: durations are stored in whole
// milliseconds, and a positive duration that rounds to 0 would be stored as none at all.
const minDuration = time.Millisecond

// parse validates a submit body and returns the job it describes, or an *InvalidError. Each
// step checks one part of the contract, in the order a client reads the errors: the JSON, the
// request, the credentials, the limits, the metadata, the idempotency key. allowed is the
// tenant's credential restriction (nil: every configured credential): a name it refuses is
// credential_not_allowed before the name is looked up, so a restricted tenant gets the same
// answer for a credential that exists and for one that does not.
func (s *contract) parse(tenant string, allowed func(string) bool, idemKey string, body []byte) (jobs.CreateParams, error) {
	b, err := decodeSubmit(body)
	if err != nil {
		return jobs.CreateParams{}, err
	}
	p := jobs.CreateParams{Tenant: tenant, Credential: "default", IdempotencyKey: idemKey, Request: b.Request,
		MaxAttempts: s.cfg.DefaultMaxAttempts, Timeout: s.cfg.DefaultTimeout, Fallbacks: b.Fallbacks}
	if b.Credential != nil {
		// A name sent, "" too, is checked as one: only an absent or null credential is the
		// default, as the contract says of every optional field.
		p.Credential = *b.Credential
	}
	for _, check := range []func() error{
		func() error { return checkRequest(b.Request) },
		func() error { return checkAllowed(tenant, allowed, p.Credential, p.Fallbacks) },
		func() error { return s.checkCredentials(p.Credential, p.Fallbacks) },
		func() error { return s.checkTokens(append([]string{p.Credential}, p.Fallbacks...), b.Request) },
		func() error { batchTimeout(b.Lane, b.Timeout, s.cfg.BatchWindows, &p); return s.parseLimits(b, &p) },
		func() error { return parseLane(b.Lane, s.cfg.BatchWindows, &p) },
		func() error { return parseMetadata(b.Metadata, &p) },
		func() error { return parsePriority(b.Priority, &p) },
		func() error { return fingerprint(idemKey, body, &p) },
	} {
		if err := check(); err != nil {
			return jobs.CreateParams{}, err
		}
	}
	return p, nil
}

// decodeSubmit decodes body strictly: one JSON object of the contract's fields, each spelled
// exactly and sent once, and nothing after; the request's fields llmq reads too (see
// checkFieldNames). The usual body is walked (scanSubmit); any other is decoded by
// decodeSubmitJSON, whose answer is the client's.
func decodeSubmit(body []byte) (submitBody, error) {
	b, ok := scanSubmit(body)
	if ok {
		// The walk took the envelope's names only spelled exactly, without escapes, each once:
		// checkFieldNames's answer is the request's.
		return b, checkRequestNames(b.Request)
	}
	b, err := decodeSubmitJSON(body)
	if err != nil {
		return b, err
	}
	// The decode matched names in any case and kept the last of duplicates: refuse what it
	// read otherwise than the provider would.
	if err := checkFieldNames(body); err != nil {
		return b, err
	}
	if slices.Contains(b.Fallbacks, "") {
		return b, checkNullFallbacks(body)
	}
	return b, nil
}

// checkNullFallbacks refuses (invalid_fallbacks) a null item of fallbacks, which encoding/json
// decodes to "": checked as a name, it was unknown_credential naming a fallback "" the client
// never sent (credential_not_allowed for a restricted tenant). body is one JSON object the
// decode took, with a fallback decoded to "" (the second decode is for those only); the walk
// (scanSubmit) takes no body with a null item.
func checkNullFallbacks(body []byte) error {
	var b struct {
		Fallbacks []*string `json:"fallbacks"`
	}
	if err := json.Unmarshal(body, &b); err != nil {
		return nil // not reached: the decode took body
	}
	for i, f := range b.Fallbacks {
		if f == nil {
			return invalid("invalid_fallbacks", "fallbacks[%d] is null: each fallback must be a credential's name", i)
		}
	}
	return nil
}

// decodeSubmitJSON decodes body with encoding/json: one JSON object of the contract's fields
// (names matched in any case, the last of duplicates kept), nothing after it.
func decodeSubmitJSON(body []byte) (submitBody, error) {
	var b submitBody
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&b); err != nil {
		var syn *json.SyntaxError
		var typ *json.UnmarshalTypeError
		switch {
		case errors.As(err, &syn), errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
			return b, invalid("invalid_json", "body is not valid JSON: %v", err)
		case errors.As(err, &typ) && typ.Field == "":
			return b, invalid("invalid_body", "the body must be a JSON object, not %s", jsonKind(typ.Value))
		case errors.As(err, &typ):
			return b, invalid("invalid_field", "field %q must be %s", typ.Field, fieldKind(typ.Field))
		case strings.HasPrefix(err.Error(), "json: unknown field"):
			return b, invalid("unknown_field", "%s", strings.TrimPrefix(err.Error(), "json: "))
		default:
			return b, invalid("invalid_json", "body is not valid JSON: %v", err)
		}
	}
	// JSON's white space only: bytes.TrimSpace also took a form feed or a no-break space.
	if len(bytes.TrimLeft(body[dec.InputOffset():], " \t\r\n")) > 0 {
		return b, invalid("invalid_json", "body has data after the JSON object")
	}
	return b, nil
}

// jsonKind names, for a client, the kind of JSON value encoding/json calls value in an
// UnmarshalTypeError ("array", "string", "number", "bool", "object").
func jsonKind(value string) string {
	switch value {
	case "array", "object":
		return "an " + value
	case "bool":
		return "a boolean"
	default:
		return "a " + value
	}
}

// fieldKind names, for a client, the JSON value the submit body's field must hold, as the
// contract (api/openapi.yaml's SubmitRequest) types it, rather than as the Go field is typed.
func fieldKind(field string) string {
	switch field {
	case "fallbacks":
		return "an array of strings" // a wrong item is named by its array too
	case "max_attempts":
		return "an integer"
	default:
		return "a string"
	}
}

// checkRequest requires the provider-native request: a JSON object Postgres can read back (see
// checkEscapes). "stream": true is accepted: the job streams its deltas (see sse.go).
func checkRequest(request json.RawMessage) error {
	if len(request) == 0 || string(request) == "null" {
		return invalid("missing_request", "field \"request\" is required: the provider-native request body")
	}
	// The body's decode (decodeSubmit) has checked that request is JSON: an object is one that
	// opens with a brace. No second parse.
	if v := bytes.TrimLeft(request, " \t\r\n"); len(v) == 0 || v[0] != '{' {
		return invalid("invalid_request", "field \"request\" must be a JSON object")
	}
	if err := checkEscapes(request); err != nil {
		return err
	}
	return nil
}

// checkCredentials requires a configured primary credential and valid fallbacks.
func (s *contract) checkCredentials(primary string, fallbacks []string) error {
	if !s.creds[primary] {
		return invalid("unknown_credential", "credential %q is not configured", truncateValue(primary))
	}
	return s.checkFallbacks(primary, fallbacks)
}

// parseLimits reads the job's timeout, its per-call timeouts and its attempts into p.
func (s *contract) parseLimits(b submitBody, p *jobs.CreateParams) error {
	if b.Timeout != nil {
		d, err := time.ParseDuration(*b.Timeout)
		if err != nil || d < minDuration || d > s.cfg.MaxTimeout {
			return invalid("invalid_timeout", "timeout %q must be a duration such as \"10m\", at least %s and at most %s", truncateValue(*b.Timeout), minDuration, s.cfg.MaxTimeout)
		}
		p.Timeout = d
	}
	var err error
	if p.AttemptTimeout, err = callTimeout("attempt_timeout", b.AttemptTimeout, p.Timeout); err != nil {
		return err
	}
	if p.FirstByteTimeout, err = callTimeout("first_byte_timeout", b.FirstByteTimeout, p.Timeout); err != nil {
		return err
	}
	if b.MaxAttempts != nil {
		if *b.MaxAttempts < 1 || *b.MaxAttempts > 100 {
			return invalid("invalid_max_attempts", "max_attempts must be between 1 and 100 (got %d)", *b.MaxAttempts)
		}
		p.MaxAttempts = int(*b.MaxAttempts)
	}
	return nil
}

// callTimeout reads the per-call timeout named name (0 when val is nil), at most the job's
// timeout. It returns the value, not a pointer into the job's parameters: a pointer kept beside
// the name its refusal quotes moved the parameters to the heap at every parse.
func callTimeout(name string, val *string, timeout time.Duration) (time.Duration, error) {
	if val == nil {
		return 0, nil
	}
	d, err := time.ParseDuration(*val)
	if err != nil || d < minDuration || d > timeout {
		return 0, invalid("invalid_timeout", "%s %q must be a duration such as \"30s\", at least %s and at most the job's timeout (%s)", name, truncateValue(*val), minDuration, timeout)
	}
	return d, nil
}

// parseMetadata keeps metadata when it is a JSON object of at most MaxMetadataBytes.
func parseMetadata(m json.RawMessage, p *jobs.CreateParams) error {
	if len(m) == 0 || string(m) == "null" {
		return nil
	}
	if m[0] != '{' {
		return invalid("invalid_metadata", "metadata must be a JSON object")
	}
	if len(m) > MaxMetadataBytes {
		return invalid("invalid_metadata", "metadata is %d bytes; at most %d allowed", len(m), MaxMetadataBytes)
	}
	p.Metadata = m
	return nil
}

// idempotencyKey is the request's Idempotency-Key, "" without one. A header sent empty or more
// than once is a 400: a client whose key went missing must not get a new, billed job at each of
// its retries.
func idempotencyKey(h http.Header) (string, error) {
	v, ok := h["Idempotency-Key"]
	switch {
	case !ok:
		return "", nil
	case len(v) != 1:
		return "", invalid("invalid_idempotency_key", "send one Idempotency-Key header, not %d", len(v))
	case v[0] == "":
		return "", invalid("invalid_idempotency_key", "Idempotency-Key is empty: it must be 1-%d printable ASCII characters without spaces", idem.MaxKeyLength)
	}
	return v[0], nil
}

// fingerprint validates the Idempotency-Key and fingerprints the body it will be compared by
// when the key comes again. Without a key there is nothing to compare: no fingerprint.
func fingerprint(idemKey string, body []byte, p *jobs.CreateParams) error {
	if idemKey == "" {
		return nil
	}
	if err := idem.ValidateKey(idemKey); err != nil {
		return invalid("invalid_idempotency_key", "Idempotency-Key %v", strings.TrimPrefix(err.Error(), idem.ErrInvalidKey.Error()+": "))
	}
	fp, err := idem.Fingerprint(body)
	if err != nil {
		return invalid("invalid_json", "body is not valid JSON: %v", err)
	}
	p.Fingerprint = fp
	return nil
}

// checkAllowed refuses (403) a primary or fallback credential that a restricted tenant may not
// use, whether or not it is configured: the answer must not tell such a tenant which names exist.
func checkAllowed(tenant string, allowed func(string) bool, primary string, fallbacks []string) error {
	if allowed == nil {
		return nil
	}
	for _, c := range append([]string{primary}, fallbacks...) {
		if !allowed(c) {
			return &InvalidError{Status: http.StatusForbidden, Type: "credential_not_allowed",
				Message: fmt.Sprintf("tenant %q may not use credential %q", tenant, c)}
		}
	}
	return nil
}

// checkEscapes refuses a request holding \u0000 or an unpaired surrogate escape (raw is valid
// JSON). The json column stores them, but Postgres cannot turn them into text: every query of
// request->>'...' on the table would then fail, and neither is text a provider can use.
func checkEscapes(raw []byte) error {
	hex := func(i int) (rune, bool) { // the \uXXXX escape starting at raw[i], if it is one
		if i+6 > len(raw) || raw[i] != '\\' || raw[i+1] != 'u' {
			return 0, false
		}
		var r rune
		for _, c := range raw[i+2 : i+6] {
			switch {
			case c >= '0' && c <= '9':
				r = r<<4 | rune(c-'0')
			case c >= 'a' && c <= 'f':
				r = r<<4 | rune(c-'a'+10)
			case c >= 'A' && c <= 'F':
				r = r<<4 | rune(c-'A'+10)
			default:
				return 0, false
			}
		}
		return r, true
	}
	// In valid JSON a backslash only occurs inside a string, as the start of an escape.
	for i := 0; i < len(raw); i++ {
		if raw[i] != '\\' {
			continue
		}
		r, ok := hex(i)
		if !ok {
			i++ // a one-letter escape such as \\ or \"
			continue
		}
		switch {
		case r == 0:
			return invalid("invalid_request", "field \"request\" must not contain \\u0000")
		case r >= 0xD800 && r <= 0xDBFF:
			if lo, ok := hex(i + 6); ok && lo >= 0xDC00 && lo <= 0xDFFF {
				i += 11
				continue
			}
			return invalid("invalid_request", "field \"request\" must not contain an unpaired surrogate escape (\\u%04x)", r)
		case r >= 0xDC00 && r <= 0xDFFF:
			return invalid("invalid_request", "field \"request\" must not contain an unpaired surrogate escape (\\u%04x)", r)
		}
		i += 5
	}
	return nil
}

// checkTokens refuses a request larger than a whole configured token bucket (OpenAI's n choices
// multiply its output) of every credential of its chain, its own and each fallback: it could
// never be sent, so it must fail now rather than after a wait. One credential that may take it
// lets it in, for a worker fails a request too large for its credential over to the next
// fallback (docs/decisions.md, "A request too large for its credential fails over"): its
// configured limits fit, or none is configured (the provider's are learned, or it judges). A
// request it cannot count (an n that is not an integer from 1 to tokens.MaxChoices, say) goes:
// the provider judges it, and refuses it before any token is used. The request is counted once:
// fallbacks share the primary's provider kind (checkFallbacks). The refusal names the job's own
// credential's limit.
func (s *contract) checkTokens(creds []string, request []byte) error {
	var (
		r     tokens.Request
		first error
	)
	for i, name := range creds {
		tl, ok := s.cfg.TokenLimits[name]
		if !ok {
			return nil
		}
		if i == 0 {
			// Counted only when a limit is configured: most submits have none to check.
			var err error
			if r, err = tokens.Count(s.cfg.Kinds[name], request); err != nil {
				return nil // the provider judges a body we cannot count
			}
		}
		err := tl.Check(tokens.Cost{InputTokens: r.Input, OutputTokens: r.MaxOutput, MinInputTokens: r.MinInput})
		if err == nil {
			return nil
		}
		if first == nil {
			first = err
		}
	}
	which := fmt.Sprintf("credential %q", creds[0])
	if len(creds) > 1 {
		which += " (and every fallback)"
	}
	return invalid("request_too_large", "%s: %v%s", which, first,
		tokens.AssumedOutputNote(first, r.AssumedOutput, s.cfg.Kinds[creds[0]]))
}

// MaxFallbacks caps the fallback list of one job.
const MaxFallbacks = 5

// checkFallbacks requires configured, distinct credentials of the primary's provider kind: the
// request body goes to each verbatim, so a different wire format cannot be a fallback.
func (s *contract) checkFallbacks(primary string, fallbacks []string) error {
	if len(fallbacks) > MaxFallbacks {
		return invalid("invalid_fallbacks", "at most %d fallbacks allowed (got %d)", MaxFallbacks, len(fallbacks))
	}
	seen := map[string]bool{primary: true}
	for _, f := range fallbacks {
		switch {
		case !s.creds[f]:
			return invalid("unknown_credential", "fallback credential %q is not configured", truncateValue(f))
		case seen[f]:
			return invalid("invalid_fallbacks", "credential %q appears twice in credential and fallbacks", f)
		case s.cfg.Kinds != nil && s.cfg.Kinds[f] != s.cfg.Kinds[primary]:
			return invalid("invalid_fallbacks", "fallback %q is of provider %s but %q is of %s: the request is sent verbatim, so fallbacks must use the same provider", f, s.cfg.Kinds[f], primary, s.cfg.Kinds[primary])
		}
		seen[f] = true
	}
	return nil
}

// submit is POST /v1/jobs: authenticate, apply the tenant's submit rate, read (within the
// replica's budget of bodies in flight, and the tenant's share of it) and parse the body once
// (which checks the tenant may use its credentials), then commit and enqueue the job. A body
// the contract refuses is still a replay when its Idempotency-Key holds a job of that body (see
// replayRefused).
//
// Its work in Postgres (the tenant's lookup, then the job's commit) lasts StoreTimeout in all,
// each of its waits for a connection StoreWait (see storeBounded); not the body's arrival, which
// the server's read timeout bounds: a large body over a slow link is no failure of the store's.
// The bounds are made where that work is, each with the request's one copy: a submit refused
// before it, or answered from the cache (authenticated), makes none for it.
func (s *Server) submit(w http.ResponseWriter, r *http.Request) {
	tn, spent, ok := s.authenticated(r, func(ar *http.Request, err error) {
		writeError(w, ar, s.cfg.Logger, err)
	})
	if !ok {
		return
	}
	// Whether the caller authenticated as tn (a token), rather than came as the anonymous tenant.
	_, authenticated := r.Header["Authorization"]
	if err := s.admit(r, tn.Name); err != nil {
		var he *httpError
		if errors.As(err, &he) {
			err = s.overShare(r, tn.Name, authenticated, he)
		}
		writeError(w, r, s.cfg.Logger, err)
		return
	}
	if r.ContentLength > s.cfg.MaxBodyBytes {
		writeError(w, r, s.cfg.Logger, bodyTooLarge(s.cfg.MaxBodyBytes))
		return
	}
	reserved := s.cfg.MaxBodyBytes
	if r.ContentLength >= 0 {
		reserved = r.ContentLength
	}
	if !s.takeBudget(w, r, s.bodies, tn.Name, authenticated, reserved, "too_many_bodies", "submit bodies", "being read") {
		return
	}
	defer s.bodies.give(tn.Name, reserved)
	body, err := io.ReadAll(http.MaxBytesReader(rootWriter(w), r.Body, s.cfg.MaxBodyBytes))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			writeError(w, r, s.cfg.Logger, bodyTooLarge(mbe.Limit))
			return
		}
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			// The server's read timeout: the body came too slowly (or not at all).
			writeError(w, r, s.cfg.Logger, &httpError{status: http.StatusRequestTimeout, typ: "request_timeout", message: "the body did not arrive within the server's read timeout"})
			return
		}
		writeError(w, r, s.cfg.Logger, &httpError{status: http.StatusBadRequest, typ: "invalid_body", message: "could not read body: " + err.Error()})
		return
	}
	// JSON is UTF-8 (RFC 8259); Postgres refuses anything else, so refuse it here with a 400 (a
	// 415 when a Content-Encoding says why: encodedRefusal).
	if !utf8.Valid(body) {
		writeError(w, r, s.cfg.Logger, encodedRefusal(r.Header, &httpError{status: http.StatusBadRequest, typ: "invalid_json", message: "body is not valid UTF-8"}))
		return
	}
	var allowed func(string) bool
	if tn.Credentials != nil {
		allowed = tn.Allows
	}
	key, err := idempotencyKey(r.Header)
	if err != nil {
		writeError(w, r, s.cfg.Logger, err)
		return
	}
	release := func() {}
	if key != "" {
		// A keyed submit holds a pool connection of its own for its transaction: within the
		// tenant's share of them (tenantGate), so that its flood leaves the others theirs.
		// The place ends with the Postgres stage (create's stored), not with the answer: the
		// enqueue that follows the commit holds no connection, and may wait for Redis.
		release, err = s.keyed.enter(r.Context(), tn.Name, s.cfg.StoreWait, tooManySubmits)
		if err != nil {
			var he *httpError
			if errors.As(err, &he) {
				err = s.overShare(r, tn.Name, authenticated, he)
			}
			writeError(w, r, s.cfg.Logger, err)
			return
		}
		defer release()
	}
	p, err := s.contract.parse(tn.Name, allowed, key, body)
	r, stop := s.storeBoundedFor(r, s.cfg.StoreTimeout-spent)
	defer stop()
	var job *jobs.Job
	replayed := false
	if err != nil {
		job, err = s.replayRefused(r.Context(), tn.Name, key, body, err)
		replayed = err == nil
	} else {
		job, replayed, err = s.create(r.Context(), p, release)
		if err != nil && key == "" {
			err = unkeyedSubmitError{err}
		}
	}
	if err != nil {
		writeError(w, r, s.cfg.Logger, encodedRefusal(r.Header, err))
		return
	}
	if replayed {
		// A replay answers the job's result, as a poll does, within the answers' budget.
		held, ok := s.holdAnswer(w, r, tn.Name, job)
		if !ok {
			return
		}
		defer s.answerBytes.give(tn.Name, held)
		w.Header().Set("Location", "/v1/jobs/"+job.ID)
		w.Header().Set("Idempotent-Replayed", "true")
		s.writeJob(w, http.StatusOK, job)
		return
	}
	w.Header().Set("Location", "/v1/jobs/"+job.ID)
	s.writeJob(w, http.StatusAccepted, job)
}

// encodedRefusal is err, or a 415 when err refuses the body as not JSON (invalid_json) and the
// request names a Content-Encoding: the submit decodes none (RFC 9110 §8.4), and a compressed body
// read as JSON would be refused as invalid UTF-8, which says nothing of the cause. A body that is
// JSON as sent is read as ever, whatever its Content-Encoding says (clients that mistake it for a
// charset, "UTF-8", were accepted by every release): refusing it would break them at an upgrade,
// and refuse the replay of a job their key holds.
func encodedRefusal(h http.Header, err error) error {
	coding := contentCoding(h)
	if coding == "" {
		return err
	}
	var he *httpError
	var inv *InvalidError
	if errors.As(err, &he) && he.typ == "invalid_json" || errors.As(err, &inv) && inv.Type == "invalid_json" {
		return &httpError{status: http.StatusUnsupportedMediaType, typ: "unsupported_content_encoding",
			message: fmt.Sprintf("the body is not JSON as sent, and its Content-Encoding %q is not decoded: send the JSON as it is (identity)", coding),
			header:  http.Header{"Accept-Encoding": {"identity"}}}
	}
	return err
}

// contentCoding returns the request's Content-Encoding when it names a coding other than
// identity, else "".
func contentCoding(h http.Header) string {
	values := h.Values("Content-Encoding")
	for _, v := range values {
		for c := range strings.SplitSeq(v, ",") {
			if c = strings.TrimSpace(c); c != "" && !strings.EqualFold(c, "identity") {
				return strings.Join(values, ", ")
			}
		}
	}
	return ""
}

// replayRefused answers a submit the contract refused (refusal, an *InvalidError) with the job
// of its Idempotency-Key when the key was used with this very body: that body was accepted then,
// and is refused now only because the configuration changed (a credential, a fallback or a batch
// lane removed, a limit lowered), on this replica or since. The key's job exists and may have run:
// refusing its replay would tell a client whose first answer was lost that nothing was stored.
// Without a usable key, or with no job of this body under it, the refusal stands.
func (s *Server) replayRefused(ctx context.Context, tenant, key string, body []byte, refusal error) (*jobs.Job, error) {
	var inv *InvalidError
	if key == "" || !errors.As(refusal, &inv) || idem.ValidateKey(key) != nil {
		return nil, refusal
	}
	fp, err := idem.Fingerprint(body)
	if err != nil {
		return nil, refusal
	}
	job, err := s.cfg.Store.Replay(ctx, tenant, key, fp)
	switch {
	case errors.Is(err, jobs.ErrNotFound):
		return nil, refusal
	case err != nil:
		// Whether the key's job exists is unknown: not a refusal, which says nothing was stored.
		return nil, err
	}
	return job, nil
}

// create commits the job, then hands it to this process's worker (Config.Handoff) or enqueues its
// task. The job exists once create returns without error, even if the enqueue failed (the
// sweeper will enqueue it): an enqueue failure is logged, not returned. replayed is true when
// the idempotency key matched an existing job with the same body.
//
// With a Handoff, a slot of it is claimed before the insert (dispatch.Handoff.Claim), and the
// job's first attempt's admission asked for once the job is known to be new
// (jobs.CreateParams.Admit), so that the insert may start the attempt too.
//
// The stages of a new job's submit go to the metrics (llmq_submit_stage_duration_seconds); a
// replay's or a failure's do not.
//
// stored is called once the job's Postgres stage has ended (its commit, or its failure), before
// the handoff or the enqueue: it frees the submit's place in tenantGate.
func (s *Server) create(ctx context.Context, p jobs.CreateParams, stored func()) (*jobs.Job, bool, error) {
	claim := s.cfg.Handoff.Claim(p.Priority, p.Lane)
	if claim != nil {
		p.Admit = claim.Admit
		// A claim not started (the insert failed, a replay, a panic) is dropped: its slot is
		// freed and Run's shutdown does not wait for it.
		defer func() {
			if claim != nil {
				claim.Drop(ctx)
			}
		}()
	}
	t0 := s.cfg.Now()
	job, replayed, err := s.cfg.Store.Create(ctx, p)
	stored()
	if err != nil || replayed {
		return job, replayed, err
	}
	t1 := s.cfg.Now()
	s.cfg.Metrics.submitStage(SubmitStageCreate, t1.Sub(t0))
	s.cfg.Metrics.submitted(job.Credential)
	if job.Lane == jobs.LaneBatch {
		return job, false, nil // the batcher collects batch-lane jobs
	}
	if claim != nil {
		// The delivery gets a copy: this job is the answer, written while the delivery runs.
		fresh := *job
		claim.Start(&fresh)
		claim = nil
		s.cfg.Metrics.submitStage(SubmitStageEnqueue, s.cfg.Now().Sub(t1))
		return job, false, nil
	}
	s.cfg.Handoff.Declined() // a new job the Handoff did not take: its task is enqueued
	if s.cfg.Enqueuer != nil {
		// The job is committed: its enqueue does not depend on the client staying for the answer,
		// and does not hold it past dispatch.RedisWait either. The sweeper enqueues what it missed.
		// The goroutine left behind holds the job's id, not the job (its request, the body).
		id, priority, bg := job.ID, job.Priority, context.WithoutCancel(ctx)
		if err := s.cfg.AfterCommit.Run(func() error {
			return s.cfg.Enqueuer.Enqueue(bg, id, priority, time.Time{})
		}); err != nil {
			s.cfg.Logger.WarnContext(ctx, "enqueue after commit failed; the sweeper will enqueue the job", "job_id", job.ID, "error", err)
		} else {
			s.cfg.Metrics.submitStage(SubmitStageEnqueue, s.cfg.Now().Sub(t1))
		}
	}
	return job, false, nil
}

// bodyTooLarge is the 413 of a submit body above limit bytes.
func bodyTooLarge(limit int64) *httpError {
	return &httpError{status: http.StatusRequestEntityTooLarge, typ: "body_too_large", message: "body exceeds " + humanBytes(limit)}
}
