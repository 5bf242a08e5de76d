package api

import (
	"context"
	"encoding/json"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/jobs"
	"github.com/llmq/llmq/internal/pgtest"
)

// TestStatusReads_ReadBegunBeforeTheTransitionServesNoStreamWokenByIt: a stream woken by a
// transition does not take a shared read that began before it and did not find the transition
// (it would miss the event until the next one); it takes the next read, which every stream that
// asked meanwhile shares. A stream told of an older event takes the read out.
func TestStatusReads_ReadBegunBeforeTheTransitionServesNoStreamWokenByIt(t *testing.T) {
	t.Parallel()
	workers, proxy, pool := heldStore(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	job := storeJob(ctx, t, workers)

	sr := newStatusReads(jobs.NewStore(pool, nil), 4, 5*time.Second, 10*time.Second, 15*time.Second, time.Now, nil)
	defer sr.follow(job.ID)()

	// A read of the events (queued only) whose read of the job is held: it began before the
	// transition.
	hold := proxy.HoldStatement("FROM jobs WHERE id = $1")
	defer hold.Release()
	type answer struct {
		read *statusRead
		err  error
	}
	read := func(after, need int) <-chan answer {
		ch := make(chan answer, 1)
		go func() {
			r, err := sr.read(ctx, job.ID, after, need)
			ch <- answer{r, err}
		}()
		return ch
	}
	early := read(0, 0)
	select {
	case <-hold.Reached():
	case <-ctx.Done():
		t.Fatal("the first read did not reach the job's read")
	}
	_, err := workers.BeginAttempt(ctx, job.ID) // running/2, committed
	require.NoError(t, err)

	told := read(1, 2)  // the notification of running/2
	fresh := read(1, 0) // a read for itself (a delta of an attempt it has not read, say)
	known := read(0, 1) // told of queued/1: the read out has it
	waitFor(t, func() bool {
		sr.mu.Lock()
		defer sr.mu.Unlock()
		e := sr.jobs[job.ID]
		return e.out != nil && e.out.joined == 3 && e.next != nil && e.next.joined == 1
	})
	hold.Release()

	seqs := func(ch <-chan answer) []int {
		t.Helper()
		select {
		case a := <-ch:
			require.NoError(t, a.err)
			var out []int
			for _, ev := range a.read.evs {
				out = append(out, ev.Seq)
			}
			return out
		case <-ctx.Done():
			t.Fatal("a read did not answer")
			return nil
		}
	}
	require.Equal(t, []int{1}, seqs(early))
	require.Equal(t, []int{1}, seqs(known))
	require.Equal(t, []int{2}, seqs(told), "the read begun after the stream was woken")
	require.Equal(t, []int{2}, seqs(fresh))
	sr.mu.Lock()
	require.Equal(t, 2, sr.jobs[job.ID].started, "two reads for four streams")
	sr.mu.Unlock()
}

// waitFor waits until cond holds, failing the test after 30s.
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 30s")
		}
		time.Sleep(time.Millisecond)
	}
}

// TestStatusReads_KeptReadHoldsNoRequest: the read a job's streams keep between its transitions
// (statusReads.last, while two or more follow it) does not hold the job's request body, which no
// event carries: an idle job of two followers held it (up to api.max_body_bytes) for as long as
// they followed it, where each stream's own read had held it for one send.
func TestStatusReads_KeptReadHoldsNoRequest(t *testing.T) {
	t.Parallel()
	pool, err := pgxpool.New(context.Background(), pgtest.URL(t))
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	store := jobs.NewStore(pool, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	request := json.RawMessage(`{"model":"m","prompt":"` + strings.Repeat("x", 256<<10) + `"}`)
	job, _, err := store.Create(ctx, jobs.CreateParams{Tenant: "default", Credential: "default", Fingerprint: "fp",
		Request: request, MaxAttempts: 5, Timeout: time.Minute})
	require.NoError(t, err)

	sr := newStatusReads(store, 4, 5*time.Second, 10*time.Second, 15*time.Second, time.Now, nil)
	defer sr.follow(job.ID)()
	defer sr.follow(job.ID)()
	read, err := sr.read(ctx, job.ID, 0, 0)
	require.NoError(t, err)
	require.Len(t, read.evs, 1)
	data, err := read.eventData(0)
	require.NoError(t, err)
	require.Contains(t, string(data), `"status":"queued"`)

	sr.mu.Lock()
	defer sr.mu.Unlock()
	kept := sr.jobs[job.ID].last
	require.NotNil(t, kept, "two streams follow the job: its last read is kept")
	require.Zero(t, len(kept.job.Request), "the kept read holds the job's request")
}

// TestStatusReads_NoRequestFromPostgres: a job's shared read (one per transition) and a stream's
// first read (WatchAndRead) do not fetch the job's request from Postgres: no event carries it.
// Both read the whole row, a body of up to api.max_body_bytes (4 MiB) per job read, only for
// the shared read to drop it.
func TestStatusReads_NoRequestFromPostgres(t *testing.T) {
	t.Parallel()
	pcfg, err := pgxpool.ParseConfig(pgtest.URL(t))
	require.NoError(t, err)
	var received atomic.Int64
	dialer := &net.Dialer{}
	pcfg.ConnConfig.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dialer.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return &countingConn{Conn: c, n: &received}, nil
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), pcfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	store := jobs.NewStore(pool, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	const body = 1 << 20
	request := json.RawMessage(`{"model":"m","prompt":"` + strings.Repeat("x", body) + `"}`)
	job, _, err := store.Create(ctx, jobs.CreateParams{Tenant: "default", Credential: "default", Fingerprint: "fp",
		Request: request, MaxAttempts: 5, Timeout: time.Minute})
	require.NoError(t, err)

	sr := newStatusReads(store, 4, 5*time.Second, 10*time.Second, 15*time.Second, time.Now, nil)
	before := received.Load()
	read, err := sr.read(ctx, job.ID, 0, 0)
	require.NoError(t, err)
	require.Len(t, read.evs, 1)
	require.Equal(t, job.ID, read.job.ID)
	require.Less(t, received.Load()-before, int64(body/4), "bytes from Postgres for the shared read")

	before = received.Load()
	evs, got, err := store.WatchAndRead(ctx, job.ID, time.Minute, 0)
	require.NoError(t, err)
	require.Len(t, evs, 1)
	require.Equal(t, jobs.StatusQueued, got.Status)
	require.Less(t, received.Load()-before, int64(body/4), "bytes from Postgres for a stream's first read")
}

// countingConn counts the bytes read from a connection.
type countingConn struct {
	net.Conn
	n *atomic.Int64
}

func (c *countingConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.n.Add(int64(n))
	return n, err
}

// TestStatusReads_ReadNoStreamWaitsForIsNotMade: a job's read waiting for its turn (behind
// another job's), counted in llmq_event_stream_reads_waiting, whose streams all left meanwhile
// (their clients gone) is not made when its turn comes: jobs that ended together with streams
// whose clients gave up read their answers one after another for no one.
func TestStatusReads_ReadNoStreamWaitsForIsNotMade(t *testing.T) {
	t.Parallel()
	workers, proxy, pool := heldStore(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	first, second := storeJob(ctx, t, workers).ID, storeJob(ctx, t, workers).ID
	m := NewMetrics(prometheus.NewRegistry())
	sr := newStatusReads(jobs.NewStore(pool, nil), 1, 5*time.Second, 10*time.Second, 15*time.Second, time.Now, m)

	// The first job's read holds the one turn.
	hold, _, firstDone := heldRead(ctx, t, sr, proxy, first, "FROM job_events WHERE job_id = $1")
	defer hold.Release()
	// The second job's read waits for the turn; its one stream leaves.
	leaving, leave := context.WithCancel(ctx)
	secondDone := make(chan error, 1)
	go func() {
		_, err := sr.read(leaving, second, 0, 0)
		secondDone <- err
	}()
	var rd *sharedRead
	waitFor(t, func() bool {
		sr.mu.Lock()
		defer sr.mu.Unlock()
		if e := sr.jobs[second]; e != nil && e.out != nil && e.out.joined == 1 {
			rd = e.out
		}
		return rd != nil
	})
	waitFor(t, func() bool { return testutil.ToFloat64(m.streamReadsWaiting) == 1 }) // llmq_event_stream_reads_waiting
	leave()
	require.ErrorIs(t, <-secondDone, context.Canceled)
	hold.Release()
	require.NoError(t, <-firstDone)

	select {
	case <-rd.done:
	case <-ctx.Done():
		t.Fatal("the second job's read did not end")
	}
	require.ErrorIs(t, rd.err, errReadAbandoned, "the read no stream waited for was made")
	require.Zero(t, testutil.ToFloat64(m.streamReadsWaiting), "no read waits")
	sr.mu.Lock()
	defer sr.mu.Unlock()
	require.NotContains(t, sr.jobs, second, "the job's entry is dropped")
}

// heldStore returns a fresh database's job store for the transitions (workers, never held), and
// a pool to it through proxy, whose statements the test can hold (each parsed: holdable).
func heldStore(t *testing.T) (workers *jobs.Store, proxy *pgtest.Proxy, pool *pgxpool.Pool) {
	t.Helper()
	dbURL := pgtest.URL(t)
	direct, err := pgxpool.New(context.Background(), dbURL)
	require.NoError(t, err)
	t.Cleanup(direct.Close)
	proxy, proxied := pgtest.NewProxy(t, dbURL)
	pool, err = pgxpool.New(context.Background(), proxied+"&default_query_exec_mode=exec")
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return jobs.NewStore(direct, nil), proxy, pool
}

// TestStatusReads_ReadItsStreamsLeftIsCancelled: a shared read running in Postgres whose
// streams all left (their clients gone) is cancelled: it read the job's events, and maybe a
// large answer, for no one until it ended or its bound (store_timeout) ran out.
func TestStatusReads_ReadItsStreamsLeftIsCancelled(t *testing.T) {
	t.Parallel()
	workers, proxy, pool := heldStore(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	job := storeJob(ctx, t, workers)
	// A bound longer than the test's: the read does not end by it.
	sr := newStatusReads(jobs.NewStore(pool, nil), 4, 5*time.Second, 2*time.Minute, 15*time.Second, time.Now, nil)
	stop := sr.follow(job.ID)

	hold, leave, done := heldRead(ctx, t, sr, proxy, job.ID, "FROM jobs WHERE id = $1")
	defer hold.Release()
	sr.mu.Lock()
	rd := sr.jobs[job.ID].out
	sr.mu.Unlock()
	require.NotNil(t, rd)
	leave()
	require.ErrorIs(t, <-done, context.Canceled)
	stop()

	// Held in Postgres until the test ends: it ends before only by being cancelled, or by the
	// job store's batch bound (10 s; the read's own is longer), whose error is not this one.
	select {
	case <-rd.done:
	case <-ctx.Done():
		t.Fatal("the read its streams all left did not end")
	}
	require.ErrorIs(t, rd.err, errReadAbandoned)
	sr.mu.Lock()
	defer sr.mu.Unlock()
	require.NotContains(t, sr.jobs, job.ID, "the job's entry is dropped")
}

// TestStatusReads_StreamJoiningAsAnotherLeavesIsServed: a stream that joins a job's read while
// its only other stream leaves gets the job's events, whichever comes first: a read cancelled
// for the one that left is not joined (the stream takes the next read), and one the stream
// joined is not cancelled.
func TestStatusReads_StreamJoiningAsAnotherLeavesIsServed(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name       string
		leaveFirst bool
		reads      int
	}{
		{"LeaveThenJoin", true, 2},
		{"JoinThenLeave", false, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			workers, proxy, pool := heldStore(t)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			job := storeJob(ctx, t, workers)
			sr := newStatusReads(jobs.NewStore(pool, nil), 4, 5*time.Second, time.Minute, 15*time.Second, time.Now, nil)
			defer sr.follow(job.ID)()
			defer sr.follow(job.ID)()

			hold, leave, left := heldRead(ctx, t, sr, proxy, job.ID, "FROM jobs WHERE id = $1")
			defer hold.Release()
			type answer struct {
				read *statusRead
				err  error
			}
			joined := make(chan answer, 1)
			join := func() {
				go func() {
					// Told of queued/1: the read out, begun before it, may serve it.
					r, err := sr.read(ctx, job.ID, 0, 1)
					joined <- answer{r, err}
				}()
			}
			if tc.leaveFirst {
				leave()
				require.ErrorIs(t, <-left, context.Canceled)
				join()
			} else {
				join()
				waitFor(t, func() bool {
					sr.mu.Lock()
					defer sr.mu.Unlock()
					return sr.jobs[job.ID].out.joined == 2
				})
				leave()
				require.ErrorIs(t, <-left, context.Canceled)
			}
			hold.Release()
			select {
			case a := <-joined:
				require.NoError(t, a.err)
				require.Len(t, a.read.evs, 1)
				require.Equal(t, 1, a.read.evs[0].Seq)
				require.Equal(t, job.ID, a.read.job.ID)
			case <-ctx.Done():
				t.Fatal("the joining stream got no answer")
			}
			sr.mu.Lock()
			defer sr.mu.Unlock()
			require.Equal(t, tc.reads, sr.jobs[job.ID].started)
		})
	}
}

// heldRead starts a stream's read of job id (from its first event), whose statement holding
// held proxy holds once it reached it, and returns the hold, the stream's leave (its client gone)
// and the read's error, sent once it returns.
func heldRead(ctx context.Context, t *testing.T, sr *statusReads, proxy *pgtest.Proxy, id, held string) (hold *pgtest.Hold, leave func(), left <-chan error) {
	t.Helper()
	hold = proxy.HoldStatement(held)
	leaving, leave := context.WithCancel(ctx)
	t.Cleanup(leave)
	done := make(chan error, 1)
	go func() {
		_, err := sr.read(leaving, id, 0, 0)
		done <- err
	}()
	select {
	case <-hold.Reached():
	case <-ctx.Done():
		hold.Release()
		t.Fatalf("the read did not reach %q", held)
	}
	return hold, leave, done
}

// storeJob stores a queued job in store.
func storeJob(ctx context.Context, t *testing.T, store *jobs.Store) *jobs.Job {
	t.Helper()
	job, _, err := store.Create(ctx, jobs.CreateParams{Tenant: "default", Credential: "default", Fingerprint: "fp",
		Request: json.RawMessage(`{"model":"m"}`), MaxAttempts: 5, Timeout: time.Minute})
	require.NoError(t, err)
	return job
}
