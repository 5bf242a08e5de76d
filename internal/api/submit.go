package api

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/llmq/llmq/internal/idem"
	"github.com/llmq/llmq/internal/jobs"
	"github.com/llmq/llmq/internal/tenant"
	"github.com/llmq/llmq/internal/tokens"
)

// InvalidError is a submission the API must refuse with 400; Type is a stable machine code and
// Message names the problem. Nothing is stored for it.
type InvalidError struct {
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
	Credential string          `json:"credential"`
	Request    json.RawMessage `json:"request"`
	Timeout    *string         `json:"timeout"`
	// AttemptTimeout and FirstByteTimeout override the credential's per-call limits.
	AttemptTimeout   *string         `json:"attempt_timeout"`
	FirstByteTimeout *string         `json:"first_byte_timeout"`
	MaxAttempts      *int            `json:"max_attempts"`
	Metadata         json.RawMessage `json:"metadata"`
	// Fallbacks are credentials tried in order after retryable failures on Credential.
	Fallbacks []string `json:"fallbacks"`
}

// MaxMetadataBytes caps the metadata object.
const MaxMetadataBytes = 16 << 10

// parse validates a submit body and returns the job it describes, or an *InvalidError. Each
// step checks one part of the contract, in the order a client reads the errors: the JSON, the
// request, the credentials, the limits, the metadata, the idempotency key.
func (s *contract) parse(tenant, idemKey string, body []byte) (jobs.CreateParams, error) {
	b, err := decodeSubmit(body)
	if err != nil {
		return jobs.CreateParams{}, err
	}
	p := jobs.CreateParams{Tenant: tenant, Credential: b.Credential, IdempotencyKey: idemKey, Request: b.Request,
		MaxAttempts: s.cfg.DefaultMaxAttempts, Timeout: s.cfg.DefaultTimeout, Fallbacks: b.Fallbacks}
	if p.Credential == "" {
		p.Credential = "default"
	}
	for _, check := range []func() error{
		func() error { return checkRequest(b.Request) },
		func() error { return s.checkCredentials(p.Credential, p.Fallbacks) },
		func() error { return s.checkTokens(append([]string{p.Credential}, p.Fallbacks...), b.Request) },
		func() error { return s.parseLimits(b, &p) },
		func() error { return parseMetadata(b.Metadata, &p) },
		func() error { return fingerprint(idemKey, body, &p) },
	} {
		if err := check(); err != nil {
			return jobs.CreateParams{}, err
		}
	}
	return p, nil
}

// decodeSubmit decodes body strictly: one JSON object of the contract's fields and nothing after.
func decodeSubmit(body []byte) (submitBody, error) {
	var b submitBody
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&b); err != nil {
		var syn *json.SyntaxError
		var typ *json.UnmarshalTypeError
		switch {
		case errors.As(err, &syn), errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
			return b, invalid("invalid_json", "body is not valid JSON: %v", err)
		case errors.As(err, &typ):
			return b, invalid("invalid_field", "field %q must be %s", typ.Field, typ.Type)
		case strings.HasPrefix(err.Error(), "json: unknown field"):
			return b, invalid("unknown_field", "%s", strings.TrimPrefix(err.Error(), "json: "))
		default:
			return b, invalid("invalid_json", "body is not valid JSON: %v", err)
		}
	}
	if len(bytes.TrimSpace(body[dec.InputOffset():])) > 0 {
		return b, invalid("invalid_json", "body has data after the JSON object")
	}
	return b, nil
}

// checkRequest requires the provider-native request: a JSON object, not streamed.
func checkRequest(request json.RawMessage) error {
	if len(request) == 0 || string(request) == "null" {
		return invalid("missing_request", "field \"request\" is required: the provider-native request body")
	}
	var req map[string]json.RawMessage
	if err := json.Unmarshal(request, &req); err != nil {
		return invalid("invalid_request", "field \"request\" must be a JSON object")
	}
	if stream, ok := req["stream"]; ok && string(stream) == "true" {
		return invalid("stream_unsupported", "\"stream\": true is not supported yet: results are delivered whole")
	}
	return nil
}

// checkCredentials requires a configured primary credential and valid fallbacks.
func (s *contract) checkCredentials(primary string, fallbacks []string) error {
	if !s.creds[primary] {
		return invalid("unknown_credential", "credential %q is not configured", primary)
	}
	return s.checkFallbacks(primary, fallbacks)
}

// parseLimits reads the job's timeout, its per-call timeouts and its attempts into p.
func (s *contract) parseLimits(b submitBody, p *jobs.CreateParams) error {
	if b.Timeout != nil {
		d, err := time.ParseDuration(*b.Timeout)
		if err != nil || d <= 0 || d > s.cfg.MaxTimeout {
			return invalid("invalid_timeout", "timeout %q must be a duration such as \"10m\", above 0 and at most %s", *b.Timeout, s.cfg.MaxTimeout)
		}
		p.Timeout = d
	}
	for _, f := range []struct {
		name string
		val  *string
		dst  *time.Duration
	}{{"attempt_timeout", b.AttemptTimeout, &p.AttemptTimeout}, {"first_byte_timeout", b.FirstByteTimeout, &p.FirstByteTimeout}} {
		if f.val == nil {
			continue
		}
		d, err := time.ParseDuration(*f.val)
		if err != nil || d <= 0 || d > p.Timeout {
			return invalid("invalid_timeout", "%s %q must be a duration such as \"30s\", above 0 and at most the job's timeout (%s)", f.name, *f.val, p.Timeout)
		}
		*f.dst = d
	}
	if b.MaxAttempts != nil {
		if *b.MaxAttempts < 1 || *b.MaxAttempts > 100 {
			return invalid("invalid_max_attempts", "max_attempts must be between 1 and 100 (got %d)", *b.MaxAttempts)
		}
		p.MaxAttempts = *b.MaxAttempts
	}
	return nil
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

// checkTokens refuses a request larger than a whole configured token bucket of its credential or
// of a fallback: it could never be sent, so it must fail now rather than after a wait.
func (s *contract) checkTokens(creds []string, request []byte) error {
	for _, name := range creds {
		tl, ok := s.cfg.TokenLimits[name]
		if !ok {
			continue
		}
		r, err := tokens.Count(s.cfg.Kinds[name], request)
		if err != nil {
			continue // the provider judges a body we cannot count
		}
		if err := tl.Check(tokens.Cost{InputTokens: r.Input, OutputTokens: r.MaxOutput}); err != nil {
			return invalid("request_too_large", "credential %q: %v", name, err)
		}
	}
	return nil
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
			return invalid("unknown_credential", "fallback credential %q is not configured", f)
		case seen[f]:
			return invalid("invalid_fallbacks", "credential %q appears twice in credential and fallbacks", f)
		case s.cfg.Kinds != nil && s.cfg.Kinds[f] != s.cfg.Kinds[primary]:
			return invalid("invalid_fallbacks", "fallback %q is a %s credential but %q is %s: the request is sent verbatim, so fallbacks must use the same provider", f, s.cfg.Kinds[f], primary, s.cfg.Kinds[primary])
		}
		seen[f] = true
	}
	return nil
}

// submit is POST /v1/jobs: authenticate, apply the tenant's submit rate, read and parse the body
// once, check the tenant may use its credentials, then commit and enqueue the job.
func (s *Server) submit(w http.ResponseWriter, r *http.Request) {
	tn, err := s.tenant(r)
	if err != nil {
		writeError(w, r, s.cfg.Logger, err)
		return
	}
	if err := s.admit(r, tn.Name); err != nil {
		writeError(w, r, s.cfg.Logger, err)
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, s.cfg.MaxBodyBytes))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			writeError(w, r, s.cfg.Logger, &httpError{status: http.StatusRequestEntityTooLarge, typ: "body_too_large", message: "body exceeds " + humanBytes(mbe.Limit)})
			return
		}
		writeError(w, r, s.cfg.Logger, &httpError{status: http.StatusBadRequest, typ: "invalid_body", message: "could not read body: " + err.Error()})
		return
	}
	// JSON is UTF-8 (RFC 8259); Postgres refuses anything else, so refuse it here with a 400.
	if !utf8.Valid(body) {
		writeError(w, r, s.cfg.Logger, &httpError{status: http.StatusBadRequest, typ: "invalid_json", message: "body is not valid UTF-8"})
		return
	}
	p, err := s.contract.parse(tn.Name, r.Header.Get("Idempotency-Key"), body)
	if err == nil {
		err = tenantMayUse(tn, p)
	}
	if err != nil {
		writeError(w, r, s.cfg.Logger, err)
		return
	}
	job, replayed, err := s.create(r.Context(), p)
	if err != nil {
		writeError(w, r, s.cfg.Logger, err)
		return
	}
	w.Header().Set("Location", "/v1/jobs/"+job.ID)
	if replayed {
		w.Header().Set("Idempotent-Replayed", "true")
		writeJSON(w, http.StatusOK, s.answer(job))
		return
	}
	writeJSON(w, http.StatusAccepted, s.answer(job))
}

// tenantMayUse refuses (403) a job naming a credential, primary or fallback, that the tenant
// may not use. The body is validated first, so an invalid one is a 400 as for anyone.
func tenantMayUse(tn *tenant.Tenant, p jobs.CreateParams) error {
	if tn.Credentials == nil {
		return nil
	}
	for _, c := range append([]string{p.Credential}, p.Fallbacks...) {
		if !tn.Allows(c) {
			return &httpError{status: http.StatusForbidden, typ: "credential_not_allowed",
				message: fmt.Sprintf("tenant %q may not use credential %q", tn.Name, c)}
		}
	}
	return nil
}

// create commits the job, then enqueues its task. The job exists once create returns without
// error, even if the enqueue failed (the sweeper will enqueue it): an enqueue failure is logged,
// not returned. replayed is true when the idempotency key matched an existing job with the same
// body.
func (s *Server) create(ctx context.Context, p jobs.CreateParams) (*jobs.Job, bool, error) {
	job, replayed, err := s.cfg.Store.Create(ctx, p)
	if err != nil || replayed {
		return job, replayed, err
	}
	s.cfg.Metrics.submitted(job.Credential)
	if s.cfg.Enqueuer != nil {
		if err := s.cfg.Enqueuer.Enqueue(ctx, job.ID, time.Time{}); err != nil {
			s.cfg.Logger.WarnContext(ctx, "enqueue after commit failed; the sweeper will enqueue the job", "job_id", job.ID, "error", err)
		}
	}
	return job, false, nil
}
