package api

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/deltastream"
	"github.com/llmq/llmq/internal/jobs"
	"github.com/llmq/llmq/internal/redistest"
)

// createStreaming stores a job whose request asks for a stream.
func (b *testBundle) createStreaming(t *testing.T) *jobs.Job {
	t.Helper()
	job, _, err := b.store.Create(context.Background(), jobs.CreateParams{
		Tenant: "default", Credential: "default", Fingerprint: "fp",
		Request: json.RawMessage(`{"model":"m","stream":true}`), MaxAttempts: 5, Timeout: time.Minute,
	})
	require.NoError(t, err)
	return job
}

// streamAttempt begins an attempt and writes its deltas as the worker does, the i-th text in
// content block i (so that each is an entry of its own).
func (b *testBundle) streamAttempt(t *testing.T, id string, texts ...string) *jobs.Job {
	t.Helper()
	job, err := b.store.BeginAttempt(context.Background(), id)
	require.NoError(t, err)
	w := b.deltas.Writer(id, job.EventSeq, job.Attempts)
	for i, text := range texts {
		w.Add(deltastream.Delta{Type: "text", Index: i, Text: text})
	}
	w.Close(t.Context())
	return job
}

// nextFrames reads the next n events.
func nextFrames(t *testing.T, s *stream, n int) []sseFrame {
	t.Helper()
	out := make([]sseFrame, n)
	for i := range out {
		out[i] = s.nextEvent(t)
	}
	return out
}

// TestEvents_StreamingJob proves that a streaming job's stream interleaves its deltas with its
// status events as they happen (the keep-alive is 15s away: the hub's wake-up delivers them),
// with ids seq.n; and that when an attempt that streamed is followed by a new attempt with no
// reset entry between (a worker killed mid-stream), the stream sends the reset itself.
func TestEvents_StreamingJob(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{deltas: true})
	job := b.createStreaming(t)
	s := openStream(t, b.url, job.ID, "")
	require.Equal(t, []string{"queued/1"}, names(nextFrames(t, s, 1)))

	// Attempt 1 streams two pieces, then its
	// worker dies: the lease runs out and attempt 2 begins, with no reset entry.
	b.streamAttempt(t, job.ID, "Hel", "lo")
	got := nextFrames(t, s, 3)
	require.Equal(t, []string{"running/2", "delta/2.1", "delta/2.2"}, names(got))
	require.JSONEq(t, `{"attempt":1,"offset":3,"type":"text","index":1,"text":"lo"}`, got[2].data)
	_, err := b.pool.Exec(context.Background(), `UPDATE jobs SET lease_until = now() - interval '1 second' WHERE id = $1`, job.ID)
	require.NoError(t, err)
	b.streamAttempt(t, job.ID, "Hi!")
	got = nextFrames(t, s, 3)
	require.Equal(t, []string{"reset/2.3", "running/3", "delta/3.1"}, names(got))
	require.JSONEq(t, `{"attempt":1}`, got[0].data)
	require.JSONEq(t, `{"attempt":2,"offset":0,"type":"text","index":0,"text":"Hi!"}`, got[2].data)

	applied, err := b.store.Finish(context.Background(), job.ID, &jobs.Attempt{Number: 2, Credential: "default",
		StartedAt: time.Now(), Class: "ok"}, jobs.Outcome{Status: jobs.StatusSucceeded, Result: []byte(`{"text":"Hi!"}`)})
	require.NoError(t, err)
	require.True(t, applied)
	rest := s.rest(t)
	require.Equal(t, []string{"succeeded/4"}, names(rest))
	require.Equal(t, map[string]any{"text": "Hi!"}, jobData(t, rest[0])["result"])

	// Resumes: inside attempt 1; right after its last delta (the reset is still owed: without it
	// the client appends attempt 2's text to attempt 1's); and between attempt 2's running event
	// and its delta.
	require.Equal(t, []string{"delta/2.2", "reset/2.3", "running/3", "delta/3.1", "succeeded/4"},
		names(openStream(t, b.url, job.ID, "2.1").rest(t)))
	require.Equal(t, []string{"reset/2.3", "running/3", "delta/3.1", "succeeded/4"},
		names(openStream(t, b.url, job.ID, "2.2").rest(t)))
	require.Equal(t, []string{"delta/3.1", "succeeded/4"}, names(openStream(t, b.url, job.ID, "3").rest(t)))
}

// A client resuming inside an attempt whose entries the buffer no longer holds (its TTL passed
// during a long Retry-After, or its bound trimmed them) still gets the reset before the retry's
// deltas: it shows that attempt's text, whether or not the stream can read it again.
func TestEvents_ResumeInAnAttemptTheBufferLostGetsTheReset(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{deltas: true})
	job := b.createStreaming(t)
	ctx := context.Background()
	b.streamAttempt(t, job.ID, "Hel", "lo") // running/2, delta/2.1, delta/2.2
	next := time.Now()
	applied, err := b.store.Finish(ctx, job.ID, &jobs.Attempt{Number: 1, Credential: "default", StartedAt: time.Now(), Class: "retryable"},
		jobs.Outcome{Status: jobs.StatusRetrying, NextAttemptAt: &next, LastError: &jobs.LastError{Class: "retryable", Status: 503, Message: "overloaded"}})
	require.NoError(t, err)
	require.True(t, applied)
	require.NoError(t, redistest.Client(t).Del(ctx, b.deltas.Key(job.ID)).Err()) // expired
	b.streamAttempt(t, job.ID, "Hi!")                                            // running/4, delta/4.1

	require.Equal(t, []string{"reset/2.3", "retrying/3", "running/4", "delta/4.1"},
		names(nextFrames(t, openStream(t, b.url, job.ID, "2.2"), 4)))
	// (Resumed after that reset, which the buffer never held, the stream cannot tell it from a
	// delta and sends another: a reset of nothing shown, harmless.)
}

// TestEvents_BufferLostMidAttemptSendsNoGap proves that when Redis loses a job's delta buffer
// while its attempt streams (a restart without persistence, a flush, a failover), a stream that
// cannot read the attempt's entries in order sends none of them past the hole: a client that
// joins, or resumes inside the attempt before the loss, is never shown a text with a piece
// missing, and gets the whole answer in the terminal event. A client that resumes right after
// the last entry it saw before the loss, and one that followed live, miss nothing and go on.
func TestEvents_BufferLostMidAttemptSendsNoGap(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{deltas: true})
	job := b.createStreaming(t)
	ctx := context.Background()
	live := openStream(t, b.url, job.ID, "")
	require.Equal(t, []string{"queued/1"}, names(nextFrames(t, live, 1)))

	started, err := b.store.BeginAttempt(ctx, job.ID)
	require.NoError(t, err)
	w := b.deltas.Writer(job.ID, started.EventSeq, started.Attempts)
	w.Add(deltastream.Delta{Type: "text", Index: 0, Text: "Hel"})
	w.Add(deltastream.Delta{Type: "text", Index: 1, Text: "lo"})
	// Both entries are in Redis once the live stream has them.
	require.Equal(t, []string{"running/2", "delta/2.1", "delta/2.2"}, names(nextFrames(t, live, 3)))

	require.NoError(t, redistest.Client(t).Del(ctx, b.deltas.Key(job.ID)).Err()) // Redis lost it
	w.Add(deltastream.Delta{Type: "text", Index: 2, Text: " wor"})
	w.Add(deltastream.Delta{Type: "text", Index: 3, Text: "ld"})
	w.Close(t.Context())
	require.Equal(t, []string{"delta/2.3", "delta/2.4"}, names(nextFrames(t, live, 2)))

	joined := openStream(t, b.url, job.ID, "")
	require.Equal(t, []string{"running/2"}, names(nextFrames(t, joined, 1)))
	resumedBefore := openStream(t, b.url, job.ID, "2.1")
	resumedAfter := openStream(t, b.url, job.ID, "2.2")
	require.Equal(t, []string{"delta/2.3", "delta/2.4"}, names(nextFrames(t, resumedAfter, 2)))

	applied, err := b.store.Finish(ctx, job.ID, &jobs.Attempt{Number: 1, Credential: "default", StartedAt: time.Now(), Class: "ok"},
		jobs.Outcome{Status: jobs.StatusSucceeded, Result: []byte(`{"text":"Hello world"}`)})
	require.NoError(t, err)
	require.True(t, applied)
	for i, s := range []*stream{live, joined, resumedBefore, resumedAfter} {
		name := []string{"live", "joined", "resumed at 2.1", "resumed at 2.2"}[i]
		rest := s.rest(t)
		require.Equal(t, []string{"succeeded/3"}, names(rest), name)
		require.Equal(t, map[string]any{"text": "Hello world"}, jobData(t, rest[0])["result"], name)
	}
}

// TestEvents_HoleVoidsOnlyItsAttempt: a stream that stopped sending an attempt's deltas at a
// hole (Redis lost its buffer mid-attempt) sends that attempt's reset when it is retried, and
// every delta of the next attempt: only the attempt with the hole is void.
func TestEvents_HoleVoidsOnlyItsAttempt(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{deltas: true})
	job := b.createStreaming(t)
	ctx := context.Background()
	started, err := b.store.BeginAttempt(ctx, job.ID)
	require.NoError(t, err)
	// Attempt 1's buffer as Redis holds it after losing its first entry: 2.2, then the reset
	// its worker wrote when the attempt failed.
	for _, e := range []struct {
		n    int
		kind string
		data string
	}{{2, deltastream.KindDelta, `{"attempt":1,"offset":3,"type":"text","index":1,"text":"lo"}`}, {3, deltastream.KindReset, `{"attempt":1}`}} {
		require.NoError(t, redistest.Client(t).XAdd(ctx, &redis.XAddArgs{Stream: b.deltas.Key(job.ID),
			Values: []any{"s", started.EventSeq, "n", e.n, "k", e.kind, "d", e.data}}).Err())
	}
	joined := openStream(t, b.url, job.ID, "")
	require.Equal(t, []string{"running/2", "reset/2.3"}, names(nextFrames(t, joined, 2)))

	next := time.Now()
	applied, err := b.store.Finish(ctx, job.ID, &jobs.Attempt{Number: 1, Credential: "default", StartedAt: time.Now(), Class: "retryable"},
		jobs.Outcome{Status: jobs.StatusRetrying, NextAttemptAt: &next, LastError: &jobs.LastError{Class: "retryable", Status: 503, Message: "overloaded"}})
	require.NoError(t, err)
	require.True(t, applied)
	b.streamAttempt(t, job.ID, "Hi", "!") // running/4, delta/4.1, delta/4.2
	require.Equal(t, []string{"retrying/3", "running/4", "delta/4.1", "delta/4.2"}, names(nextFrames(t, joined, 4)))
}

// TestEvents_LostAttemptWaitingForItsCredentialGetsTheReset: an attempt that streamed and whose
// worker died, its job then moved to retrying to wait for its credential
// (jobs.Store.WaitForCredential), is followed by a reset before that retrying event: the client
// does not keep showing the lost attempt's text while the job waits, nor append the next
// attempt's to it; a client resuming inside the lost attempt gets the same.
func TestEvents_LostAttemptWaitingForItsCredentialGetsTheReset(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{deltas: true})
	job := b.createStreaming(t)
	ctx := context.Background()
	s := openStream(t, b.url, job.ID, "")
	require.Equal(t, []string{"queued/1"}, names(nextFrames(t, s, 1)))
	b.streamAttempt(t, job.ID, "Hel", "lo")
	require.Equal(t, []string{"running/2", "delta/2.1", "delta/2.2"}, names(nextFrames(t, s, 3)))

	_, err := b.pool.Exec(ctx, `UPDATE jobs SET lease_until = now() - interval '1 second' WHERE id = $1`, job.ID)
	require.NoError(t, err)
	require.NoError(t, b.store.WaitForCredential(ctx, job.ID, job.CredentialIndex, time.Now().Add(time.Minute), "credential paused: manual"))
	got := nextFrames(t, s, 2)
	require.Equal(t, []string{"reset/2.3", "retrying/3"}, names(got))
	require.JSONEq(t, `{"attempt":1}`, got[0].data)

	b.streamAttempt(t, job.ID, "Hi!")
	require.Equal(t, []string{"running/4", "delta/4.1"}, names(nextFrames(t, s, 2)))
	require.Equal(t, []string{"reset/2.3", "retrying/3", "running/4", "delta/4.1"},
		names(nextFrames(t, openStream(t, b.url, job.ID, "2.2"), 4)))
}

// TestEvents_OpeningReadsNoRequest: a stream's opening learns whether its job streams without
// reading the job's request (Postgres answers it: jobs.Store.GetForStream), by a bearer token's
// path and a signed URL's alike, and the stream still carries the job's deltas. Each opening
// read the whole request before: a 4 MB request made each stream's opening read 4 MB.
func TestEvents_OpeningReadsNoRequest(t *testing.T) {
	t.Parallel()
	signer, err := NewStreamSigner(streamKey, 10*time.Minute, time.Now)
	require.NoError(t, err)
	queries := &queryCounter{sqls: make(chan string, 1000)}
	b := setup(t, setupOpts{deltas: true, signer: signer, queries: queries})
	for _, signed := range []bool{false, true} {
		job := b.createStreaming(t)
		path := "/v1/jobs/" + job.ID + "/events"
		if signed {
			path = signer.URL(job.ID)
		}
		s := openStreamPath(t, b.url, path, "")
		require.Equal(t, []string{"queued/1"}, names(nextFrames(t, s, 1)))
		b.streamAttempt(t, job.ID, "Hel")
		require.Equal(t, []string{"running/2", "delta/2.1"}, names(nextFrames(t, s, 2)), "signed %v", signed)
		s.close()
	}
	for {
		select {
		case sql := <-queries.sqls:
			// jobColumns reads the request after the metadata; the other column lists read NULL.
			require.NotContains(t, sql, "metadata, request,", "a statement read a job's request")
			continue
		default:
		}
		break
	}
}

// TestEvents_EndedJobsStreamReadsNoDeltas: a stream opened without Last-Event-ID on a streaming
// job that has ended starts at its terminal event, which carries the whole answer, and sends no
// delta; it read the job's whole delta buffer from Redis all the same (page after page, up to
// streaming.buffer_max_entries), to drop it. A stream resuming inside the attempt still replays
// its deltas.
func TestEvents_EndedJobsStreamReadsNoDeltas(t *testing.T) {
	t.Parallel()
	reads := redistest.NewCommands("xrange", "xrevrange") // the reads of delta buffers
	b := setup(t, setupOpts{deltas: true, redisHook: reads})
	job := b.createStreaming(t)
	attempt := b.streamAttempt(t, job.ID, "Hel", "lo")
	applied, err := b.store.Finish(t.Context(), job.ID, &jobs.Attempt{
		Number: attempt.Attempts, Credential: "default", StartedAt: time.Now(), Latency: time.Millisecond, Class: "ok",
	}, jobs.Outcome{Status: jobs.StatusSucceeded, Result: json.RawMessage(`{"text":"Hello"}`)})
	require.NoError(t, err)
	require.True(t, applied)

	before := reads.Count()
	s := openStream(t, b.url, job.ID, "")
	require.Equal(t, []string{"succeeded/3"}, names(nextFrames(t, s, 1)))
	s.close()
	require.Equal(t, before, reads.Count(), "the stream of an ended job read its delta buffer")

	// Resumed inside the attempt, the stream replays the attempt's deltas after the one it had.
	s = openStream(t, b.url, job.ID, "2.1")
	require.Equal(t, []string{"delta/2.2", "succeeded/3"}, names(nextFrames(t, s, 2)))
	s.close()
}
