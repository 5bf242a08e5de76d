package credpause

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/llmq/llmq/internal/alert"
	"github.com/llmq/llmq/internal/limiter"
)

// SpendCapParams describe a spend-cap answer for PauseSpendCap.
type SpendCapParams struct {
	// Alerter raises the pause's alert. Nil: none.
	Alerter *alert.Alerter
	// Credential is the credential's configured name (alerts and logs; never the key).
	Credential string
	// Gate is the credential's limiter gate, whose pause stops its sends. Nil: nothing to
	// pause (a credential without a limiter); the spend cap is only alerted, throttled.
	Gate *limiter.Gate
	// JobID is the job whose answer showed the spend cap ("" for none: a batch's).
	JobID string
	// Logger receives the pause Postgres failed to record. Required.
	Logger *slog.Logger
	// Message says what was refused, for the alert.
	Message string
	// Reason is the pause's reason (a dead reason of retrypolicy.Decision).
	Reason string
	// Store keeps the pause in Postgres too. Nil: in Redis alone (limiter.Gate.Pause).
	Store *Store
}

// PauseSpendCap pauses the credential after a spend-cap answer, so that no further request
// burns on it until an operator (or the pause's probe) resumes it: through Store (Store.Pause),
// or in Redis alone without one. It raises the alert once per pause episode, across processes:
// only the call that started the episode raises it. A pause Postgres failed to record while
// Redis holds it is logged, not returned: Redis's pause is what stops the sends, and the durable
// copy is written by the next spend-cap answer. The error returned is Redis's (the credential
// may be paused nowhere). It is safe for concurrent use.
func PauseSpendCap(ctx context.Context, p SpendCapParams) error {
	if p.Gate == nil {
		p.Alerter.Throttled(ctx, alert.Alert{Credential: p.Credential, Reason: p.Reason,
			JobID: p.JobID, Message: p.Message}, time.Minute)
		return nil
	}
	var (
		started bool
		err     error
	)
	if p.Store != nil {
		started, err = p.Store.Pause(ctx, p.Gate, p.Reason, p.JobID)
		if errors.Is(err, ErrDatabase) {
			attrs := []any{"credential", p.Credential, "error", err}
			if p.JobID != "" {
				attrs = append(attrs, "job_id", p.JobID)
			}
			p.Logger.ErrorContext(ctx,
				"record a credential pause in postgres (it is kept in redis only)", attrs...)
			err = nil
		}
	} else {
		started, err = p.Gate.Pause(ctx, p.Reason, p.JobID)
	}
	if started {
		p.Alerter.Raise(ctx, alert.Alert{Credential: p.Credential, Reason: p.Reason, JobID: p.JobID,
			Message: "credential paused until an operator resumes it (ctl credentials resume " +
				p.Credential + "): " + p.Message})
	}
	return err
}
