package executor

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/dispatch"
	"github.com/llmq/llmq/internal/jobs"
	"github.com/llmq/llmq/internal/pgtest"
)

// TestOutcome_ElsewhereDeferralKeepsAnotherDeliverysFailover: two deliveries of one job race. A
// process of an older config (it does not know the job's credential, added by a rolling deploy)
// reads the job and defers it for a process that knows the credential (elsewhere); meanwhile a
// process that knows it finds it paused and fails the job over to its fallback, due at once.
// The first delivery's deferral then answers: it writes nothing over the move. It wrote its
// recheck (the paused recheck, about 30 s) into the moved row, holding the job back on its
// fallback as if the left credential still had it.
func TestOutcome_ElsewhereDeferralKeepsAnotherDeliverysFailover(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	store := jobs.NewStore(pgtest.Pool(t), nil)
	old := New(Config{Store: store, Upstreams: map[string]Upstream{"backup": {Name: "backup"}}})
	job, _, err := store.Create(ctx, jobs.CreateParams{Tenant: "default", Credential: "added", Fallbacks: []string{"backup"},
		Request: json.RawMessage(`{"model":"m"}`), MaxAttempts: 3, Timeout: time.Hour})
	require.NoError(t, err)

	// The old config's delivery reads the job and defers it for a process that knows "added".
	err = old.process(ctx, job.ID, true, &gatePass{g: old.backlog}, true)
	df, ok := errors.AsType[*deferral](err)
	require.True(t, ok, "deferred: %v", err)
	require.True(t, df.elsewhere)
	// The other delivery fails the job over (what failOver does, breaker open or paused).
	moved, err := store.NextCredential(ctx, job.ID, 0)
	require.NoError(t, err)
	require.True(t, moved)

	// The old config's deferral answers: it comes back later, and the row stays the move's.
	_, ok = errors.AsType[*dispatch.DeferError](old.outcome(ctx, job.ID, df))
	require.True(t, ok)
	got, err := store.Get(ctx, job.ID)
	require.NoError(t, err)
	require.Equal(t, "backup", got.CurrentCredential())
	require.Nil(t, got.NextAttemptAt, "the fallback takes the job at once")
}
