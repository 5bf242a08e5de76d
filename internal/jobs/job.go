package jobs

import (
	"encoding/json"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"
)

// Status is a job's place in its lifecycle:
// queued → running → succeeded | failed | dead | canceled, with running → retrying → running
// between attempts.
type Status string

// The statuses.
const (
	StatusQueued    Status = "queued"
	StatusRunning   Status = "running"
	StatusRetrying  Status = "retrying"
	StatusSucceeded Status = "succeeded"
	StatusFailed    Status = "failed"
	StatusDead      Status = "dead"
	StatusCanceled  Status = "canceled"
)

// Terminal reports whether no further attempt will be made.
func (s Status) Terminal() bool {
	switch s {
	case StatusSucceeded, StatusFailed, StatusDead, StatusCanceled:
		return true
	}
	return false
}

// Valid reports whether s is one of the statuses.
func (s Status) Valid() bool {
	switch s {
	case StatusQueued, StatusRunning, StatusRetrying:
		return true
	}
	return s.Terminal()
}

// Lane is how a job reaches its provider.
type Lane string

// The lanes. "auto" is a submit option only: it resolves to one of these.
const (
	// LaneOnline: the executor calls the provider under the shared limiter (the default).
	LaneOnline Lane = "online"
	// LaneBatch: the batcher sends the job in a provider batch (half the price, hours of wait).
	LaneBatch Lane = "batch"
)

// Reasons a job ends dead or failed.
const (
	ReasonRateLimitedNoRetryAfter = "rate_limited_no_retry_after"
	ReasonRetriesExhausted        = "retries_exhausted"
	ReasonDeadlineExceeded        = "deadline_exceeded"
	// ReasonCredentialNotConfigured: the job's credential, and every fallback left, is in no
	// config of the worker that delivered it (removed or renamed, past executor.RolloutGrace).
	// A dead letter, not a failure: once the credential is back, a retry runs the job.
	ReasonCredentialNotConfigured = "credential_not_configured"
)

// DeadReasons returns the reasons a job is dead-lettered for (Job.DeadReason): the values a
// dead-letter filter by reason (DeadFilter.Reason) can match, in a new slice. Every dead job
// the executor and the batch lane make has one of them (ReasonDeadlineExceeded ends a job
// failed, not dead).
func DeadReasons() []string {
	return []string{ReasonRateLimitedNoRetryAfter, ReasonRetriesExhausted, ReasonCredentialNotConfigured}
}

// ValidDeadReason reports whether r is one of DeadReasons: a filter by another matches no job.
func ValidDeadReason(r string) bool { return slices.Contains(DeadReasons(), r) }

// Job is the stored state of one LLM request. Its JSON form is the API contract.
type Job struct {
	ID         string `json:"id"`
	Tenant     string `json:"-"`
	Status     Status `json:"status"`
	Credential string `json:"credential"`
	// Fallbacks are tried in order after retryable failures on Credential.
	Fallbacks []string `json:"fallbacks"`
	// AnsweredBy is the credential whose answer is stored (null until succeeded).
	AnsweredBy *string `json:"answered_by"`
	// CredentialIndex is the position in [Credential] + Fallbacks of the next attempt.
	CredentialIndex int      `json:"-"`
	IdempotencyKey  *string  `json:"idempotency_key"`
	Attempts        int      `json:"attempts"`
	MaxAttempts     int      `json:"max_attempts"`
	Timeout         Duration `json:"timeout"`
	// AttemptTimeout and FirstByteTimeout are the job's overrides of its credential's limits
	// on one provider call (total, and until the first body byte); null: the credential's.
	AttemptTimeout   *Duration       `json:"attempt_timeout"`
	FirstByteTimeout *Duration       `json:"first_byte_timeout"`
	Deadline         time.Time       `json:"deadline"`
	CreatedAt        time.Time       `json:"created_at"`
	StartedAt        *time.Time      `json:"started_at"`
	FinishedAt       *time.Time      `json:"finished_at"`
	NextAttemptAt    *time.Time      `json:"next_attempt_at"`
	LastError        *LastError      `json:"last_error"`
	Result           json.RawMessage `json:"result"`
	Usage            json.RawMessage `json:"usage"`
	DeadReason       *string         `json:"dead_reason"`
	Metadata         json.RawMessage `json:"metadata"`
	// Lane is the lane the job takes: online or batch (see Lane).
	Lane Lane `json:"lane"`
	// BatchID and BatchState are the provider's batch id and its state while the job is (or was
	// last) in a provider batch (null: never batched; "waiting": in the batch lane, not yet in a
	// batch; "committed": in a batch not yet sent; "canceled": canceled before a batch sent it).
	BatchID    *string `json:"batch_id"`
	BatchState *string `json:"batch_state"`
	// CostClass says at which price the stored result was bought: "batch" (the providers' batch
	// discount) or "online"; null until succeeded.
	CostClass *string `json:"cost_class"`
	// Priority orders the waiting work of the job's tenant on a credential (see Priority).
	Priority Priority `json:"priority"`
	// Request is the provider-native body, sent verbatim. Not part of the job JSON (it can be
	// large and is the client's own); ctl shows its size.
	Request json.RawMessage `json:"-"`
	// EventSeq is the sequence number of the job's latest event.
	EventSeq int `json:"-"`
	// SlotSeq is set while the job holds a limiter slot at NextAttemptAt.
	SlotSeq *int64 `json:"-"`
	// SlotGrant is the token reservation that goes with SlotSeq (nil: none).
	SlotGrant *int64 `json:"-"`
	// LeaseToken identifies the delivery whose attempt holds the job until LeaseUntil (nil:
	// none). See Store.BeginAttempt.
	LeaseToken *string    `json:"-"`
	LeaseUntil *time.Time `json:"-"`
}

// Leased reports whether an attempt's lease holds the job at now.
func (j *Job) Leased(now time.Time) bool {
	return j.Status == StatusRunning && j.LeaseUntil != nil && j.LeaseUntil.After(now)
}

// CurrentCredential is the credential the next attempt uses.
func (j *Job) CurrentCredential() string {
	if j.CredentialIndex == 0 || len(j.Fallbacks) == 0 {
		return j.Credential
	}
	return j.Fallbacks[min(j.CredentialIndex, len(j.Fallbacks))-1]
}

// HasNextCredential reports whether a fallback remains after the current credential.
func (j *Job) HasNextCredential() bool { return j.CredentialIndex < len(j.Fallbacks) }

// Priority orders the waiting work of one tenant on a credential: a tenant's free slots go to its
// highest priority with work, except for the minimum share each lower priority with work keeps
// (internal/limiter, Fairness). Tenants share a credential by weight whatever their priorities.
type Priority string

// The priorities.
const (
	PriorityHigh   Priority = "high"
	PriorityNormal Priority = "normal"
	PriorityLow    Priority = "low"
)

// Valid reports whether p is one of the priorities.
func (p Priority) Valid() bool {
	return p == PriorityHigh || p == PriorityNormal || p == PriorityLow
}

// LastError describes the latest failed attempt.
type LastError struct {
	Class        string `json:"class"`
	Status       int    `json:"status,omitempty"`
	Type         string `json:"type,omitempty"`
	Message      string `json:"message"`
	RetryAfterMS *int64 `json:"retry_after_ms,omitempty"`
}

// Duration marshals as a Go duration string ("10m0s").
type Duration time.Duration

// MarshalJSON implements json.Marshaler.
func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(time.Duration(d).String()) }

// ValidID reports whether id is a job ID in the form the API hands out: 36 characters with
// hyphens, either case. uuid.Parse also accepts the urn:uuid: prefix, braces and bare hex, and
// Postgres refuses the first; an ID in another form names no job (ErrNotFound), never an error,
// and a caller telling an operator why an ID was not acted on says "not a job ID".
func ValidID(id string) bool { return len(id) == 36 && uuid.Validate(id) == nil }

// CanonicalID is id in the form the store answers with: lower case. An ID in capitals names the
// same job (ValidID); a caller comparing the IDs it asked about with those the store acted on
// compares these.
func CanonicalID(id string) string { return strings.ToLower(id) }
