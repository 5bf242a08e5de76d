package jobs

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"time"

	"github.com/llmq/llmq/internal/idem"
	"github.com/llmq/llmq/internal/limiter"
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

// SubmitConfig holds the submit defaults and limits.
type SubmitConfig struct {
	// Credentials are the names jobs may use.
	Credentials []string
	// Kinds maps credential names to their provider kind; fallbacks must share the primary's.
	// Nil: not checked.
	Kinds map[string]string
	// TokenLimits are the credentials' configured token buckets: a request that can never fit
	// one is refused at submit. Missing: not checked (learned limits are checked by the worker).
	TokenLimits map[string]TokenLimits
	// DefaultMaxAttempts applies when the body has no max_attempts. Default 10.
	DefaultMaxAttempts int
	// DefaultTimeout applies when the body has no timeout. Default 10m.
	DefaultTimeout time.Duration
	// MaxTimeout caps a job's timeout. Default 24h.
	MaxTimeout time.Duration
}

// Submitter validates submissions, stores them and hands them to the queue. Safe for concurrent use.
type Submitter struct {
	store    *Store
	enqueuer *Enqueuer
	cfg      SubmitConfig
	creds    map[string]bool
	logger   *slog.Logger
	metrics  *Metrics
}

// NewSubmitter returns a Submitter. Zero config fields take their defaults; metrics may be nil.
func NewSubmitter(store *Store, enq *Enqueuer, cfg SubmitConfig, logger *slog.Logger, metrics *Metrics) *Submitter {
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
	return &Submitter{store: store, enqueuer: enq, cfg: cfg, creds: creds, logger: logger, metrics: metrics}
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

// Parse validates a submit body and returns the job it describes, or an *InvalidError.
func (s *Submitter) Parse(tenant, idemKey string, body []byte) (CreateParams, error) {
	var b submitBody
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&b); err != nil {
		var syn *json.SyntaxError
		var typ *json.UnmarshalTypeError
		switch {
		case errors.As(err, &syn), errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
			return CreateParams{}, invalid("invalid_json", "body is not valid JSON: %v", err)
		case errors.As(err, &typ):
			return CreateParams{}, invalid("invalid_field", "field %q must be %s", typ.Field, typ.Type)
		case strings.HasPrefix(err.Error(), "json: unknown field"):
			return CreateParams{}, invalid("unknown_field", "%s", strings.TrimPrefix(err.Error(), "json: "))
		default:
			return CreateParams{}, invalid("invalid_json", "body is not valid JSON: %v", err)
		}
	}
	if len(bytes.TrimSpace(body[dec.InputOffset():])) > 0 {
		return CreateParams{}, invalid("invalid_json", "body has data after the JSON object")
	}
	if len(b.Request) == 0 || string(b.Request) == "null" {
		return CreateParams{}, invalid("missing_request", "field \"request\" is required: the provider-native request body")
	}
	var req map[string]json.RawMessage
	if err := json.Unmarshal(b.Request, &req); err != nil {
		return CreateParams{}, invalid("invalid_request", "field \"request\" must be a JSON object")
	}
	if stream, ok := req["stream"]; ok && string(stream) == "true" {
		return CreateParams{}, invalid("stream_unsupported", "\"stream\": true is not supported yet: results are delivered whole")
	}
	p := CreateParams{
		Tenant:         tenant,
		Credential:     b.Credential,
		IdempotencyKey: idemKey,
		Request:        b.Request,
		MaxAttempts:    s.cfg.DefaultMaxAttempts,
		Timeout:        s.cfg.DefaultTimeout,
		Metadata:       b.Metadata,
	}
	if p.Credential == "" {
		p.Credential = "default"
	}
	if !s.creds[p.Credential] {
		return CreateParams{}, invalid("unknown_credential", "credential %q is not configured", p.Credential)
	}
	if err := s.checkFallbacks(p.Credential, b.Fallbacks); err != nil {
		return CreateParams{}, err
	}
	p.Fallbacks = b.Fallbacks
	if err := s.checkTokens(append([]string{p.Credential}, p.Fallbacks...), b.Request); err != nil {
		return CreateParams{}, err
	}
	if b.Timeout != nil {
		d, err := time.ParseDuration(*b.Timeout)
		if err != nil || d <= 0 || d > s.cfg.MaxTimeout {
			return CreateParams{}, invalid("invalid_timeout", "timeout %q must be a duration such as \"10m\", above 0 and at most %s", *b.Timeout, s.cfg.MaxTimeout)
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
			return CreateParams{}, invalid("invalid_timeout", "%s %q must be a duration such as \"30s\", above 0 and at most the job's timeout (%s)", f.name, *f.val, p.Timeout)
		}
		*f.dst = d
	}
	if b.MaxAttempts != nil {
		if *b.MaxAttempts < 1 || *b.MaxAttempts > 100 {
			return CreateParams{}, invalid("invalid_max_attempts", "max_attempts must be between 1 and 100 (got %d)", *b.MaxAttempts)
		}
		p.MaxAttempts = *b.MaxAttempts
	}
	if len(b.Metadata) > 0 && string(b.Metadata) != "null" {
		if b.Metadata[0] != '{' {
			return CreateParams{}, invalid("invalid_metadata", "metadata must be a JSON object")
		}
		if len(b.Metadata) > MaxMetadataBytes {
			return CreateParams{}, invalid("invalid_metadata", "metadata is %d bytes; at most %d allowed", len(b.Metadata), MaxMetadataBytes)
		}
	} else {
		p.Metadata = nil
	}
	if idemKey == "" {
		return p, nil // no key, nothing to compare a retry's body with: no fingerprint
	}
	if err := idem.ValidateKey(idemKey); err != nil {
		return CreateParams{}, invalid("invalid_idempotency_key", "Idempotency-Key %v", strings.TrimPrefix(err.Error(), idem.ErrInvalidKey.Error()+": "))
	}
	fp, err := idem.Fingerprint(body)
	if err != nil {
		return CreateParams{}, invalid("invalid_json", "body is not valid JSON: %v", err)
	}
	p.Fingerprint = fp
	return p, nil
}

// TokenLimits are a credential's configured token buckets, per minute (0: none).
type TokenLimits struct {
	InputPerMinute, OutputPerMinute, CombinedPerMinute float64
}

// checkTokens refuses a request larger than a whole configured token bucket of its credential or
// of a fallback: it could never be sent, so it must fail now rather than after a wait.
func (s *Submitter) checkTokens(creds []string, request []byte) error {
	for _, name := range creds {
		tl, ok := s.cfg.TokenLimits[name]
		if !ok {
			continue
		}
		r, err := tokens.Count(s.cfg.Kinds[name], request)
		if err != nil {
			continue // the provider judges a body we cannot count
		}
		lim := limiter.Limit{InputTokensPerMinute: tl.InputPerMinute, OutputTokensPerMinute: tl.OutputPerMinute, TokensPerMinute: tl.CombinedPerMinute}
		if err := lim.CheckCost(tokens.Cost{InputTokens: r.Input, OutputTokens: r.MaxOutput}); err != nil {
			return invalid("request_too_large", "credential %q: %v", name, err)
		}
	}
	return nil
}

// MaxFallbacks caps the fallback list of one job.
const MaxFallbacks = 5

// checkFallbacks requires configured, distinct credentials of the primary's provider kind: the
// request body goes to each verbatim, so a different wire format cannot be a fallback.
func (s *Submitter) checkFallbacks(primary string, fallbacks []string) error {
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

// Submit validates the body, commits the job, then enqueues its task. The job exists once Submit
// returns without error, even if the enqueue failed (the sweeper will enqueue it): an enqueue
// failure is logged, not returned. replayed is true when the idempotency key matched an
// existing job with the same body.
func (s *Submitter) Submit(ctx context.Context, tenant, idemKey string, body []byte) (*Job, bool, error) {
	p, err := s.Parse(tenant, idemKey, body)
	if err != nil {
		return nil, false, err
	}
	job, replayed, err := s.store.Create(ctx, p)
	if err != nil {
		return nil, false, err
	}
	if !replayed {
		s.metrics.submit(job.Credential)
		if err := s.enqueuer.Enqueue(ctx, job.ID, time.Time{}); err != nil {
			s.logger.WarnContext(ctx, "enqueue after commit failed; the sweeper will enqueue the job", "job_id", job.ID, "error", err)
		}
	}
	return job, replayed, nil
}
