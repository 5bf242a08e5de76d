package executor_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/dispatch"
	"github.com/llmq/llmq/internal/executor"
	"github.com/llmq/llmq/internal/jobs"
	"github.com/llmq/llmq/internal/llm"
	"github.com/llmq/llmq/internal/llmsim"
	"github.com/llmq/llmq/internal/pgtest"
)

// A provider call answers while the worker's Postgres connections land on a server that refuses
// writes (a failover: a standby not yet promoted, or default_transaction_read_only; SQLSTATE
// 25006). The call is made and paid for: the delivery keeps trying to store its answer, as while
// Postgres cannot be reached, and stores it once writes are accepted again. The job succeeds on
// its one call, instead of the delivery returning an error that leaves the job's lease to run out
// and the call to be made again.
func TestExecutor_RecordsAnAnswerOncePostgresIsWritableAgain(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool, err := pgxpool.New(ctx, pgtest.URL(t))
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	store := jobs.NewStore(pool, nil)
	readOnly := func(on bool) {
		sql := `DO $$ BEGIN EXECUTE format('ALTER DATABASE %I RESET default_transaction_read_only', current_database()); END $$`
		if on {
			sql = `DO $$ BEGIN EXECUTE format('ALTER DATABASE %I SET default_transaction_read_only = on', current_database()); END $$`
		}
		c, err := pool.Acquire(context.WithoutCancel(ctx))
		if err == nil {
			// The session's own setting first: a read-only session may not alter the database.
			if _, err = c.Exec(ctx, "SET default_transaction_read_only = off"); err == nil {
				_, err = c.Exec(ctx, sql)
			}
			c.Release()
		}
		if err != nil {
			t.Errorf("set the database read-only=%v: %v", on, err)
		}
		pool.Reset() // the pool's next connections are new: they take the setting
	}
	var calls atomic.Int32
	sim := llmsim.New(llmsim.Config{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		readOnly(true) // the failover happens while the call is out
		sim.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	p, err := llm.New(llm.Config{Kind: llm.KindAnthropic, BaseURL: srv.URL, APIKey: "sk-readonly"})
	require.NoError(t, err)
	retrying := make(chan struct{})
	var once sync.Once
	logger := slog.New(&signalHandler{msg: "postgres unavailable while recording", signal: func() { once.Do(func() { close(retrying) }) }})
	ex := executor.New(executor.Config{Store: store, Logger: logger, Upstreams: map[string]executor.Upstream{
		"default": {Name: "default", Kind: string(llm.KindAnthropic), Provider: p},
	}})
	job, _, err := store.Create(ctx, jobs.CreateParams{Tenant: "default", Credential: "default", MaxAttempts: 3, Timeout: time.Minute,
		Request: json.RawMessage(`{"model":"claude-test","max_tokens":16,"messages":[{"role":"user","content":"hi"}]}`)})
	require.NoError(t, err)

	// When the delivery's call answers while Postgres refuses writes
	done := make(chan error, 1)
	go func() { done <- ex.Process(ctx, dispatch.Delivery{JobID: job.ID}) }()

	// Then it keeps trying to store the answer
	select {
	case <-retrying:
	case err := <-done:
		t.Fatalf("the delivery returned while Postgres refused writes: %v", err)
	case <-time.After(20 * time.Second):
		t.Fatal("the delivery neither retried its record nor returned within 20s")
	}

	// And once writes are accepted again, stores it: the job succeeded, on its one call
	readOnly(false)
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(30 * time.Second):
		t.Fatal("the delivery did not return within 30s of Postgres taking writes again")
	}
	got, err := store.Get(ctx, job.ID)
	require.NoError(t, err)
	require.Equal(t, jobs.StatusSucceeded, got.Status)
	require.Equal(t, 1, got.Attempts)
	require.Equal(t, int32(1), calls.Load())
}

// signalHandler is a slog.Handler that calls signal for each record whose message starts with msg.
type signalHandler struct {
	msg    string
	signal func()
}

func (h *signalHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h *signalHandler) Handle(_ context.Context, r slog.Record) error {
	if strings.HasPrefix(r.Message, h.msg) {
		h.signal()
	}
	return nil
}
func (h *signalHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *signalHandler) WithGroup(string) slog.Handler      { return h }
