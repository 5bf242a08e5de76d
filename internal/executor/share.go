package executor

import (
	"context"
	"time"

	"github.com/llmq/llmq/internal/jobs"
)

// reasonOverShare is the reason of a delivery deferred because its tenant holds its share of the
// process's delivery slots (Config.Slots).
const reasonOverShare = "its tenant holds its share of this worker's delivery slots"

// takeShare takes one of the process's delivery slots in the share of the job's tenant
// (Config.Slots), or answers a *deferral when the tenant holds its share already: the job comes
// back after the tracker's delay, having taken no send slot and counted no attempt. It errs when
// the tenant's weight cannot be read (the delivery fails on the store, as its lane's would).
func (e *Executor) takeShare(ctx context.Context, job *jobs.Job) error {
	w, err := e.weight(ctx, job.Tenant)
	if err != nil {
		return err
	}
	single := e.cfg.SingleTenant != nil && e.cfg.SingleTenant()
	ok, delay := e.shares.Take(job.Tenant, w, single)
	if ok {
		return nil
	}
	e.cfg.Metrics.shareDeferred(job.Tenant)
	// The slots that turn a delivery away are the few free ones (the reserve), which meet an
	// over-share tenant's backlog task after task: each turn away costs the job's read and its
	// deferral's write, so a short pause keeps them from reading through a backlog in a hot loop
	// (at most 1/turnAwayPause a slot), at the price of finding another tenant's task behind
	// that backlog turnAwayPause a task later.
	if err := sleep(ctx, turnAwayPause); err != nil {
		return err
	}
	return &deferral{until: e.cfg.Now().Add(delay), reason: reasonOverShare, credential: job.CredentialIndex, read: true}
}

// turnAwayPause is how long a delivery turned away for its tenant's share holds its slot first.
const turnAwayPause = 20 * time.Millisecond
