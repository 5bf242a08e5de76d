package api

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/clocktest"
	"github.com/llmq/llmq/internal/logtest"
)

// manualTimers stands in for a throttle's afterFunc: the reports it schedules run when fire
// says, in the order scheduled.
type manualTimers struct {
	mu     sync.Mutex
	timers []func()
}

func (m *manualTimers) afterFunc(_ time.Duration, f func()) func() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.timers = append(m.timers, f)
	return func() bool { return true }
}

// fire runs every report scheduled so far.
func (m *manualTimers) fire(t *testing.T) {
	t.Helper()
	m.mu.Lock()
	due := m.timers
	m.timers = nil
	m.mu.Unlock()
	require.NotEmpty(t, due, "no report scheduled")
	for _, f := range due {
		f()
	}
}

// TestAuthLog_LastSuppressedAreLoggedByMessage: the lines of refused credentials (a tenant's
// rotated-out token, its revoked token) were throttled by tenant alone, their held-back count
// written only with the tenant's next line: a revoked token's first request, within a minute of
// a rotated-out token's line, was not logged at all (its count went to a later line, of
// either message), and a client that stopped left its last minute uncounted. Now each message
// of a tenant is throttled apart, and what was held back is reported, with its message and
// tenant, once the minute has passed.
func TestAuthLog_LastSuppressedAreLoggedByMessage(t *testing.T) {
	t.Parallel()
	var logs logtest.Buffer
	clock := clocktest.New(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	b := setup(t, setupOpts{noListener: true, now: clock.Now, logger: slog.New(slog.NewJSONHandler(&logs, nil))})
	var timers manualTimers
	b.srv.authLog.SetAfterFunc(timers.afterFunc)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, old, err := b.tenants.Create(ctx, "a", nil)
	require.NoError(t, err)
	rotation, err := b.tenants.Rotate(ctx, "a", 0)
	require.NoError(t, err)
	as := func(token, want string) {
		t.Helper()
		r := httptest.NewRequestWithContext(ctx, http.MethodGet, "/v1/jobs/x", nil)
		r.Header.Set("Authorization", "Bearer "+token)
		_, err := b.srv.tenant(r)
		var he *httpError
		require.ErrorAs(t, err, &he)
		require.Equal(t, want, he.typ, he.message)
	}
	for range 3 {
		as(old, "unauthorized") // rotated out
	}
	_, err = b.tenants.Revoke(ctx, "a")
	require.NoError(t, err)
	for range 4 {
		as(rotation.Token, "token_revoked")
	}
	require.Equal(t, 1, logs.Count(`"msg":"request with a tenant's rotated-out token"`), logs.String())
	require.Equal(t, 1, logs.Count(`"msg":"request with a revoked tenant's token"`), "the first of each message is logged: %s", logs.String())

	clock.Advance(authLogInterval)
	timers.fire(t)
	require.Equal(t, 1, logs.Count(`"msg":"request with a tenant's rotated-out token","tenant":"a","suppressed":2`), logs.String())
	require.Equal(t, 1, logs.Count(`"msg":"request with a revoked tenant's token","tenant":"a","suppressed":3`), logs.String())

	// The report counts as a line; after Shutdown no report is scheduled.
	b.srv.Shutdown()
	as(rotation.Token, "token_revoked") // held back: within the interval of the report
	clock.Advance(authLogInterval)
	as(rotation.Token, "token_revoked") // logged, with the one held back
	as(rotation.Token, "token_revoked") // held back, and never reported after Shutdown
	timers.mu.Lock()
	require.Empty(t, timers.timers, "no report scheduled after Shutdown")
	timers.mu.Unlock()
	require.Equal(t, 3, logs.Count(`"msg":"request with a revoked tenant's token"`), logs.String())
	require.Equal(t, 1, logs.Count(`"msg":"request with a revoked tenant's token","tenant":"a","method":"GET","path":"/v1/jobs/x","suppressed":1`), logs.String())
}

// TestRefusalLog_LastSuppressedAreLogged: the refusals' lines (a tenant over its share, by
// tenant and type; the lookups of new tokens refused) wrote their held-back count only with
// the key's next line, which may never come: the last minute of a flood was never counted in
// the log. Now it is reported, with the key's message, tenant and type, once the minute passed.
func TestRefusalLog_LastSuppressedAreLogged(t *testing.T) {
	t.Parallel()
	var logs logtest.Buffer
	clock := clocktest.New(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	b := setup(t, setupOpts{noListener: true, now: clock.Now, logger: slog.New(slog.NewJSONHandler(&logs, nil))})
	var timers manualTimers
	b.srv.refusalLog.SetAfterFunc(timers.afterFunc)
	r := httptest.NewRequest(http.MethodGet, "/v1/jobs/x/events", nil)
	for range 3 {
		b.srv.overShare(r, "a", true, &httpError{status: http.StatusTooManyRequests, typ: "too_many_streams"})
	}
	for range 2 {
		b.srv.overShare(r, "a", false, &httpError{status: http.StatusTooManyRequests, typ: "too_many_cancels"})
	}
	for range 4 {
		// As the refusal of a lookup of a new token logs (tenant: ErrNewTokenLookupsFull).
		if log, _ := b.srv.refusalLog.Allow(newTokenLookupsLogKey); log {
			b.srv.cfg.Logger.Warn(msgNewTokenLookupsRefused, "suppressed", 0)
		}
	}
	require.Equal(t, 2, logs.Count(`"msg":"tenant over its share; refused"`), logs.String())

	clock.Advance(authLogInterval)
	timers.fire(t)
	require.Equal(t, 1, logs.Count(`"msg":"tenant over its share; refused","tenant":"a","type":"too_many_streams","suppressed":2`), logs.String())
	require.Equal(t, 1, logs.Count(`"msg":"tenant over its share; refused","tenant":"a","type":"too_many_cancels","suppressed":1`), logs.String())
	require.Equal(t, 1, logs.Count(`"msg":"lookups of bearer tokens never known hold their share of the pool; refused","suppressed":3`), logs.String())
}
