package api

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/llmq/llmq/internal/deltastream"
	"github.com/llmq/llmq/internal/jobs"
	"github.com/llmq/llmq/internal/tenant"
)

// StreamSigner issues and checks signed event-stream URLs: /v1/jobs/{id}/events?token=T, where T
// is "<expiry, Unix seconds>.<HMAC-SHA256 of the job ID and the expiry>". A browser's EventSource
// cannot send an Authorization header, and a tenant's bearer token is long-lived and opens every
// job of the tenant: it must not sit in a page or a URL. A token opens one job's stream, for a
// few minutes, and nothing else; none of a revoked tenant's jobs (Server.signedTenant). Every
// replica holding the same key accepts every replica's tokens; nothing is stored. Safe for
// concurrent use.
type StreamSigner struct {
	key []byte
	ttl time.Duration
	now func() time.Time
}

// NewStreamSigner returns a StreamSigner with key (at least 32 bytes) whose URLs are accepted for
// ttl after they are issued (0: 10 minutes). now is the clock; nil means time.Now.
func NewStreamSigner(key []byte, ttl time.Duration, now func() time.Time) (*StreamSigner, error) {
	if len(key) < 32 {
		return nil, fmt.Errorf("stream URL key: %d bytes, want at least 32", len(key))
	}
	if ttl <= 0 {
		ttl = 10 * time.Minute
	}
	if now == nil {
		now = time.Now
	}
	return &StreamSigner{key: key, ttl: ttl, now: now}, nil
}

// URL returns the signed event-stream URL of the job (a path: resolve it against the API's base
// URL).
func (s *StreamSigner) URL(jobID string) string {
	exp := strconv.FormatInt(s.now().Add(s.ttl).Unix(), 10)
	return "/v1/jobs/" + jobID + "/events?token=" + exp + "." + s.mac(jobID, exp)
}

func (s *StreamSigner) mac(jobID, exp string) string {
	m := hmac.New(sha256.New, s.key)
	// The prefix keeps these MACs apart from any other use of the key; the separator makes the
	// message unambiguous (neither a UUID nor a number holds a newline).
	m.Write([]byte("llmq event stream v1\n" + jobID + "\n" + exp))
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// check verifies token for the job: nil, or the 401 to answer. jobID is the path's, in either
// case (a poll takes it so too); URL signs the lower-case ID Postgres writes.
func (s *StreamSigner) check(jobID, token string) error {
	exp, sig, ok := strings.Cut(token, ".")
	unix, err := strconv.ParseInt(exp, 10, 64)
	if !ok || err != nil || !hmac.Equal([]byte(sig), []byte(s.mac(strings.ToLower(jobID), exp))) {
		return streamTokenError("invalid_stream_token", "this stream URL is not valid for this job")
	}
	if !s.now().Before(time.Unix(unix, 0)) {
		return streamTokenError("stream_token_expired", "this stream URL has expired; get the job again for a new events_url")
	}
	return nil
}

// streamTokenError is the 401 of a signed URL's token that does not open the stream; its
// challenge names the other way in, a bearer token (RFC 6750).
func streamTokenError(typ, message string) *httpError {
	e := unauthorized("invalid_token", message)
	e.typ = typ
	return e
}

// streamCaller authorizes the request for an event stream, reading no job: a signed URL's token
// when the query has one (tokens, its values: checked in memory), else the caller's bearer token
// (or the anonymous tenant), whose tenant it returns (authenticated: a cached answer taken as it
// is, a lookup bounded as a poll's, by storeBounded). It comes before the stream takes any place
// (see events): a request that fails it holds none, and is answered on w (refuseStream; ok
// false). A query giving token more than once is refused (401 invalid_stream_token), whatever
// its values.
func (s *Server) streamCaller(w http.ResponseWriter, r *http.Request, tokens []string) (caller *tenant.Tenant, ok bool) {
	refuse := func(ar *http.Request, err error) { s.refuseStream(w, ar, err) }
	if tokens == nil {
		caller, _, ok = s.authenticated(r, refuse)
		return caller, ok
	}
	if len(tokens) > 1 {
		// Read first, a URL appended to would open the stream by what it began with.
		e := unauthorized("invalid_request", fmt.Sprintf("the stream URL gives \"token\" %d times: give it once", len(tokens)))
		e.typ = "invalid_stream_token"
		refuse(r, e)
		return nil, false
	}
	if s.cfg.StreamSigner == nil {
		refuse(r, streamTokenError("invalid_stream_token", "this server issues no stream URLs"))
		return nil, false
	}
	if err := s.cfg.StreamSigner.check(r.PathValue("id"), tokens[0]); err != nil {
		refuse(r, err)
		return nil, false
	}
	return nil, true
}

// streamJob returns the job whose events the request asks for, once streamCaller authorized it,
// and whether it streams its deltas (deltastream.Requested of its request): the URL's job for a
// signed URL, unless its tenant was revoked (signedTenant), else one of caller's (as jobOf). The
// job is read without its request and its result (jobs.Store.GetForStream: Postgres says whether
// the request streams): the stream sends neither, and reads the job again as it starts (the
// result its terminal event carries). A 4 MB request made each opening read 4 MB before.
func (s *Server) streamJob(r *http.Request, caller *tenant.Tenant, signed bool) (job *jobs.Job, streams bool, err error) {
	job, streams, err = s.cfg.Store.GetForStream(r.Context(), r.PathValue("id"), deltastream.Requested)
	if err != nil {
		return nil, false, err
	}
	if !signed {
		if job.Tenant != caller.Name {
			return nil, false, jobs.ErrNotFound
		}
		return job, streams, nil
	}
	if err := s.signedTenant(r, job.Tenant); err != nil {
		return nil, false, err
	}
	return job, streams, nil
}

// signedTenant checks that a signed URL of a job of the named tenant still opens its stream: nil,
// or, once the tenant is revoked, the 403 token_revoked its bearer token is answered (a tenant
// revoked because its token leaked must not go on being followed through the URLs it was handed,
// each a capability for one of its jobs until it expires), or the lookup's failure. The lookup
// is the tenants' cache's (Authenticator.Named): one Postgres read per tenant and cache TTL on a
// replica, however many of its streams ask, and a revocation reaches it within that TTL, as it
// reaches the tenant's bearer tokens. A deleted tenant has no job left (tenant.Store.Delete):
// its URLs are answered 404 at the job's read.
func (s *Server) signedTenant(r *http.Request, name string) error {
	return s.checkSignedTenant(r, name, false)
}

// checkSignedTenant is signedTenant, its lookup answered from the tenants' cache alone when
// cachedOnly (Authenticator.CachedNamed: tenant.ErrNotCached when it holds no fresh answer).
func (s *Server) checkSignedTenant(r *http.Request, name string, cachedOnly bool) error {
	if s.cfg.Tenants == nil {
		return nil
	}
	var t *tenant.Tenant
	var err error
	if cachedOnly {
		t, err = s.cfg.Tenants.CachedNamed(name)
	} else {
		t, err = s.cfg.Tenants.Named(r.Context(), name)
	}
	if errors.Is(err, tenant.ErrRevoked) {
		return s.revokedTenant(r, t, "this stream URL's tenant was revoked")
	}
	return err
}

// jobJSON is a job as the API answers with it: with its signed events_url when the server
// issues them.
type jobJSON struct {
	*jobs.Job
	EventsURL string `json:"events_url,omitempty"`
}

// answer returns what to encode for job.
func (s *Server) answer(job *jobs.Job) any {
	if s.cfg.StreamSigner == nil {
		return job
	}
	return jobJSON{Job: job, EventsURL: s.cfg.StreamSigner.URL(job.ID)}
}
