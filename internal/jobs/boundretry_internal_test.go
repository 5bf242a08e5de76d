package jobs

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/pgtest"
	"github.com/llmq/llmq/internal/pgwait"
)

// slotTaker is a pool's pgwait.Tracer that, once armed, has "another request" take the pool's
// connection ahead of each of the store's Acquires and keep it for hold: a pool that stays full
// past a bound. The connection is taken before the bound's own timer starts, so the store's
// Acquire waits at least hold.
type slotTaker struct {
	pgwait.Tracer
	armed func() bool
	hold  time.Duration
	mu    sync.Mutex
	taken int
}

type takerKey struct{}

func (s *slotTaker) TraceAcquireStart(ctx context.Context, p *pgxpool.Pool, d pgxpool.TraceAcquireStartData) context.Context {
	if ctx.Value(takerKey{}) == nil && s.armed() {
		tctx, cancel := context.WithTimeout(context.WithValue(context.Background(), takerKey{}, true), 30*time.Second)
		c, err := p.Acquire(tctx)
		cancel()
		if err == nil {
			s.mu.Lock()
			s.taken++
			s.mu.Unlock()
			time.AfterFunc(s.hold, c.Release)
		}
	}
	return s.Tracer.TraceAcquireStart(ctx, p, d)
}

// Taken is how many times the pool was taken.
func (s *slotTaker) Taken() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.taken
}

// newBoundCutStore is newCutStore with a pool of one connection carrying a slotTaker armed once
// the proxy has lost an answer.
func newBoundCutStore(t *testing.T) (*Store, *pgtest.Proxy, *pgxpool.Pool, *slotTaker) {
	t.Helper()
	ctx := context.Background()
	dbURL := pgtest.URL(t)
	cutter, viaCutter := pgtest.NewProxy(t, dbURL)
	pcfg, err := pgxpool.ParseConfig(viaCutter + "&pool_max_conns=1")
	require.NoError(t, err)
	taker := &slotTaker{armed: func() bool { return cutter.LostAnswers() > 0 }, hold: time.Second}
	pcfg.ConnConfig.Tracer = taker
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	_, err = pool.Exec(ctx, `SELECT 1`) // its connection made, not dialed within a bound
	require.NoError(t, err)
	direct, err := pgxpool.New(ctx, dbURL)
	require.NoError(t, err)
	t.Cleanup(direct.Close)
	return NewStore(pool, nil), cutter, direct, taker
}

// A bounded create (an API submit, pgwait.Bound) commits and its answer is lost; the pool is full
// for longer than the bound when the store runs it again. The bound is for a wait before
// anything was sent: here the job may exist, and the create's answer (its own row, found again)
// is what the submit needs. Answering the bound (503 overloaded, "nothing was done") would have
// a keyless client submit, and pay for, the job a second time.
func TestCreate_BoundedWhoseCommitAnswerIsLostWaitsForItsRowPastTheBound(t *testing.T) {
	t.Parallel()
	s, cutter, direct, taker := newBoundCutStore(t)
	base, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	ctx, done := pgwait.Bound(base, 200*time.Millisecond)
	defer done()

	cutter.LoseNextAnswer()
	job, _, err := s.Create(ctx, cutTestParams)

	require.NoError(t, err, "a create that committed is answered with its job, not the bound")
	require.Equal(t, 1, cutter.LostAnswers(), "the create's commit answer was dropped")
	require.Positive(t, taker.Taken(), "the pool was full when the create ran again")
	require.Equal(t, StatusQueued, job.Status)
	requireStored(t, direct, 1, 1)
}

// The same for bounded creates batched together: the batch commits, its answer is lost, and the
// pool is full past the bound when its statements run again one by one.
func TestCreate_BoundedBatchWhoseCommitAnswerIsLostWaitsForItsRowsPastTheBound(t *testing.T) {
	t.Parallel()
	s, cutter, direct, taker := newBoundCutStore(t)
	base, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	ctx, done := pgwait.Bound(base, 200*time.Millisecond)
	defer done()

	var jobs [2]*Job
	var errs [2]error
	inOneBatchWithItsAnswerLost(t, s, cutter,
		func() { jobs[0], _, errs[0] = s.Create(ctx, cutTestParams) },
		func() { jobs[1], _, errs[1] = s.Create(ctx, cutTestParams) })

	require.NoError(t, errs[0], "a create that committed is answered with its job, not the bound")
	require.NoError(t, errs[1], "a create that committed is answered with its job, not the bound")
	require.Positive(t, taker.Taken(), "the pool was full when the creates ran again")
	require.NotEqual(t, jobs[0].ID, jobs[1].ID)
	requireStored(t, direct, 2, 2)
}

// In `llmq serve` the API's creates and the worker's transitions share one batcher. A batch
// mixing a bounded create (an API submit, pgwait.Bound) with a statement without a bound (a
// worker's) waits for a connection as long as the unbounded one may; the create must still be
// answered by its own bound (ErrTimeout, nothing sent) while the pool stays full, not held until
// a connection comes (past the server's write timeout, which cuts the client off unanswered).
// The unbounded statement still runs once a connection comes.
func TestBatch_MixedBoundedCreateIsAnsweredByItsBound(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	pcfg, err := pgxpool.ParseConfig(pgtest.URL(t) + "&pool_max_conns=1")
	require.NoError(t, err)
	pcfg.ConnConfig.Tracer = pgwait.Tracer{}
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	s := NewStore(pool, nil)
	existing, _, err := s.Create(ctx, cutTestParams)
	require.NoError(t, err)

	// The pool's only connection is taken; a batch is out, so both statements queue for the next.
	held, err := pool.Acquire(ctx)
	require.NoError(t, err)
	release := sync.OnceFunc(held.Release)
	t.Cleanup(release)
	require.Eventually(t, func() bool {
		s.batch.mu.Lock()
		defer s.batch.mu.Unlock()
		if s.batch.inFlight != 0 {
			return false
		}
		s.batch.inFlight = 1
		return true
	}, 30*time.Second, time.Millisecond)
	bounded, done := pgwait.Bound(ctx, 100*time.Millisecond)
	defer done()
	created := make(chan error, 1)
	go func() {
		_, _, err := s.Create(bounded, cutTestParams)
		created <- err
	}()
	got := make(chan error, 1)
	go func() {
		_, err := s.Get(ctx, existing.ID) // a worker's: no bound
		got <- err
	}()
	require.Eventually(t, func() bool {
		s.batch.mu.Lock()
		defer s.batch.mu.Unlock()
		return len(s.batch.pending) == 2
	}, 30*time.Second, time.Millisecond)
	go s.batch.send()

	select {
	case err := <-created:
		require.Error(t, err)
		require.True(t, pgwait.TimedOut(bounded, err), "the create is answered by its bound: %v", err)
	case <-time.After(30 * time.Second): // 300 bounds
		release()
		t.Fatalf("the bounded create waited for a connection past its bound: %v", <-created)
	}
	release()
	require.NoError(t, <-got, "the unbounded statement runs once a connection comes")
	var n int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM jobs`).Scan(&n))
	require.Equal(t, 1, n, "the refused create stored nothing")
}
