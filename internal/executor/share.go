package executor

import (
	"context"

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
	return &deferral{until: e.cfg.Now().Add(delay), reason: reasonOverShare}
}
