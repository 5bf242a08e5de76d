package executor_test

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/breaker"
	"github.com/llmq/llmq/internal/clocktest"
	"github.com/llmq/llmq/internal/deltastream"
	"github.com/llmq/llmq/internal/dispatch"
	"github.com/llmq/llmq/internal/executor"
	"github.com/llmq/llmq/internal/jobs"
	"github.com/llmq/llmq/internal/jobstest"
	"github.com/llmq/llmq/internal/limiter"
	"github.com/llmq/llmq/internal/llm"
	"github.com/llmq/llmq/internal/llmsim"
	"github.com/llmq/llmq/internal/redistest"
	"github.com/llmq/llmq/internal/retrypolicy"
)

// streamingRequest is a small Anthropic request body asking for a stream.
var streamingRequest = json.RawMessage(`{"model":"m","max_tokens":64,"stream":true,"messages":[{"role":"user","content":"hi"}]}`)

// TestExecutor_StreamingJob proves what a streaming job's deliveries leave behind: the first
// attempt fails after 3 tokens (an overloaded_error event) and is retried; the job's buffer holds
// that attempt's deltas, then its reset, then the retry's deltas, all written before each outcome
// was recorded; Postgres holds one result, the retry's assembled message, with its usage.
func TestExecutor_StreamingJob(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := jobstest.New(t)
	rdb := redistest.Client(t)
	buf := deltastream.New(deltastream.Config{Redis: rdb, Prefix: redistest.Prefix(t)})
	p := simProvider(t, llmsim.Config{ReplyTokens: 12, Faults: llmsim.Faults{StreamFailNext: 1, StreamFailAfter: 3}}, "sk-stream")
	ex := executor.New(executor.Config{Store: b.Store, Deltas: buf,
		Policy:    retrypolicy.New(&retrypolicy.Config{BaseDelay: time.Millisecond, MaxDelay: 2 * time.Millisecond}),
		Upstreams: map[string]executor.Upstream{"default": {Name: "default", Kind: string(llm.KindAnthropic), Provider: p}}})
	job, _, err := b.Store.Create(ctx, jobs.CreateParams{Tenant: "default", Credential: "default",
		Request:     streamingRequest,
		MaxAttempts: 3, Timeout: time.Minute})
	require.NoError(t, err)

	var deferred *dispatch.DeferError
	require.True(t, errors.As(ex.Process(ctx, dispatch.Delivery{JobID: job.ID}), &deferred), "attempt 1 is retried")
	mid, err := buf.Read(ctx, job.ID, "", 100)
	require.NoError(t, err)
	require.NotEmpty(t, mid)
	require.Equal(t, deltastream.KindReset, mid[len(mid)-1].Kind, "the reset is in the buffer once the retry is recorded")
	ttl, err := rdb.PTTL(ctx, buf.Key(job.ID)).Result()
	require.NoError(t, err)
	require.Greater(t, ttl, time.Minute, "a job not ended keeps its buffer for the buffer's TTL")
	require.NoError(t, ex.Process(ctx, dispatch.Delivery{JobID: job.ID}))
	ttl, err = rdb.PTTL(ctx, buf.Key(job.ID)).Result()
	require.NoError(t, err)
	require.LessOrEqual(t, ttl, time.Minute, "an ended job's buffer lives a minute (EndedTTL)")

	got, err := b.Store.Get(ctx, job.ID)
	require.NoError(t, err)
	require.Equal(t, jobs.StatusSucceeded, got.Status)
	require.Equal(t, 2, got.Attempts)
	var result struct {
		Content []struct {
			Text string `json:"text"`
		} `json:"content"`
		StopReason string `json:"stop_reason"`
	}
	require.NoError(t, json.Unmarshal(got.Result, &result))
	require.Equal(t, "end_turn", result.StopReason)
	require.JSONEq(t, `{"input_tokens":1,"output_tokens":12}`, string(got.Usage), "the stream's usage, for the token limiter too")

	entries, err := buf.Read(ctx, job.ID, "", 100)
	require.NoError(t, err)
	texts := map[int]string{}
	var kinds []string
	for _, e := range entries {
		if len(kinds) == 0 || kinds[len(kinds)-1] != e.Kind {
			kinds = append(kinds, e.Kind)
		}
		var d struct {
			Attempt int    `json:"attempt"`
			Text    string `json:"text"`
		}
		require.NoError(t, json.Unmarshal(e.Data, &d))
		texts[d.Attempt] += d.Text
	}
	require.Equal(t, []string{"delta", "reset", "delta"}, kinds)
	require.Equal(t, result.Content[0].Text, texts[2], "the retry's deltas add up to the stored result")
	require.Equal(t, result.Content[0].Text[:12], texts[1], "attempt 1 streamed 3 tokens")
	require.Equal(t, entries[0].Seq+2, entries[len(entries)-1].Seq, "running, retrying, running: the retry's seq")
}

// TestExecutor_StreamedProbeLetsOthersInAtItsHeaders: a credential's first attempts wait for news
// of the provider: with its limit unknown, for the one probe that learns it; with its breaker
// cold, for a first Success; paused, for its probe to get through. When that attempt is a
// streaming job, the limiter and the breaker hear its headers when they come, not when the
// stream ends: here the first stream is held after its first delta, and a second job on the
// credential is let in and finishes meanwhile (told after the stream, it would wait for the
// whole of it).
func TestExecutor_StreamedProbeLetsOthersInAtItsHeaders(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		limit   limiter.Limit // zero: learned
		breaker bool          // a breaker that lets one attempt out while cold
		paused  bool          // the credential paused, one probe an hour
	}{
		{name: "limit being learned"},
		{name: "cold breaker", limit: limiter.Limit{Rate: 100, Burst: 100}, breaker: true},
		{name: "paused credential", limit: limiter.Limit{Rate: 100, Burst: 100}, paused: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := t.Context()
			b := jobstest.New(t)
			rdb := redistest.Client(t)
			buf := deltastream.New(deltastream.Config{Redis: rdb, Prefix: redistest.Prefix(t)})
			limCfg := &limiter.Config{Prefix: redistest.Prefix(t)}
			clock := clocktest.New(time.Now())
			if tc.paused {
				limCfg.Now = clock.Now // the pause's first probe comes an interval after it began
			}
			lim, err := limiter.New(rdb, limCfg)
			require.NoError(t, err)
			key := "sk-streamed-probe"
			up := executor.Upstream{Name: "default", Kind: string(llm.KindAnthropic), Gate: lim.Gate(key, "default"),
				Limit: tc.limit}
			ready := func() bool { // the news the second job waits for
				_, src, err := up.Gate.Current(ctx)
				return err == nil && src == limiter.SourceLearned
			}
			if tc.breaker {
				brk, err := breaker.New(rdb, &breaker.Config{Prefix: redistest.Prefix(t), Threshold: 1})
				require.NoError(t, err)
				up.Circuit = brk.Circuit(key, "default")
				ready = func() bool {
					st, err := up.Circuit.Status(ctx)
					return err == nil && !st.Capped
				}
			}
			if tc.paused {
				_, err := up.Gate.Pause(ctx, "spend cap", "")
				require.NoError(t, err)
				up.PauseProbeInterval = time.Hour
				clock.Advance(time.Hour) // one probe now, the next an hour later
				ready = func() bool {
					ps, err := up.Gate.Paused(ctx)
					return err == nil && !ps.Paused
				}
			}
			p := &holdFirstStream{Provider: simProvider(t, llmsim.Config{ReplyTokens: 5, Capacity: 100, RefillPerSecond: 100}, key),
				held: make(chan struct{}), release: make(chan struct{})}
			up.Provider = p
			ex := executor.New(executor.Config{Store: b.Store, Deltas: buf, Upstreams: map[string]executor.Upstream{"default": up}})
			create := func(body string) *jobs.Job {
				t.Helper()
				job, _, err := b.Store.Create(ctx, jobs.CreateParams{Tenant: "default", Credential: "default",
					Request: json.RawMessage(body), MaxAttempts: 1, Timeout: time.Minute})
				require.NoError(t, err)
				return job
			}
			first := create(string(streamingRequest))
			other := create(string(helloRequest))
			require.False(t, ready(), "nothing heard before the first attempt")

			firstDone, finished := make(chan error, 1), make(chan struct{})
			go func() {
				defer close(finished)
				firstDone <- ex.Process(ctx, dispatch.Delivery{JobID: first.ID})
			}()
			defer func() { // a failed assertion below must not leave the first delivery running
				p.free()
				select {
				case <-finished:
				case <-time.After(30 * time.Second):
				}
			}()
			select {
			case <-p.held:
			case <-time.After(30 * time.Second):
				t.Fatal("the first stream never delivered its first delta")
			}
			require.Eventually(t, ready, 30*time.Second, 5*time.Millisecond, "heard while the first job streams")
			otherCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
			defer cancel()
			require.NoError(t, ex.Process(otherCtx, dispatch.Delivery{JobID: other.ID}), "let in while the first job streams")
			got, err := b.Store.Get(ctx, other.ID)
			require.NoError(t, err)
			require.Equal(t, jobs.StatusSucceeded, got.Status)

			p.free()
			select {
			case err := <-firstDone:
				require.NoError(t, err)
			case <-time.After(30 * time.Second):
				t.Fatal("the first job did not finish once released")
			}
			got, err = b.Store.Get(ctx, first.ID)
			require.NoError(t, err)
			require.Equal(t, jobs.StatusSucceeded, got.Status)
		})
	}
}

// TestExecutor_StreamFailingMidwayCountsForTheBreaker: a stream that began with a 2xx told the
// breaker a Success then; when it fails midway (an overloaded_error event after 3 tokens), that
// failure still counts: with a threshold of 2, the success did not reset what came after it, and
// a second such stream opens the breaker.
func TestExecutor_StreamFailingMidwayCountsForTheBreaker(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := jobstest.New(t)
	rdb := redistest.Client(t)
	buf := deltastream.New(deltastream.Config{Redis: rdb, Prefix: redistest.Prefix(t)})
	lim, err := limiter.New(rdb, &limiter.Config{Prefix: redistest.Prefix(t)})
	require.NoError(t, err)
	brk, err := breaker.New(rdb, &breaker.Config{Prefix: redistest.Prefix(t), Threshold: 2})
	require.NoError(t, err)
	key := "sk-stream-fails"
	p := simProvider(t, llmsim.Config{ReplyTokens: 12, Capacity: 100, RefillPerSecond: 100,
		Faults: llmsim.Faults{StreamFailNext: 2, StreamFailAfter: 3}}, key)
	circuit := brk.Circuit(key, "default")
	ex := executor.New(executor.Config{Store: b.Store, Deltas: buf, Upstreams: map[string]executor.Upstream{"default": {
		Name: "default", Kind: string(llm.KindAnthropic), Provider: p, Gate: lim.Gate(key, "default"), Circuit: circuit,
		Limit: limiter.Limit{Rate: 100, Burst: 100}}}})
	for i := range 2 {
		job, _, err := b.Store.Create(ctx, jobs.CreateParams{Tenant: "default", Credential: "default",
			Request:     streamingRequest,
			MaxAttempts: 1, Timeout: time.Minute})
		require.NoError(t, err)
		require.NoError(t, ex.Process(ctx, dispatch.Delivery{JobID: job.ID}))
		got, err := b.Store.Get(ctx, job.ID)
		require.NoError(t, err)
		require.Equal(t, jobs.StatusDead, got.Status, "stream %d failed midway, its only attempt", i)
		st, err := circuit.Status(ctx)
		require.NoError(t, err)
		if i == 0 {
			require.Equal(t, breaker.Closed, st.State)
			require.Equal(t, 1, st.Failures, "the failure counted after the stream's start was a Success")
			require.False(t, st.Capped, "the Success lifted the cold-start cap")
		} else {
			require.Equal(t, breaker.Open, st.State, "two failures in a row")
		}
	}
}

// holdFirstStream is a provider whose first streamed answer stops after its first delta (closing
// held) until release is closed (free).
type holdFirstStream struct {
	llm.Provider
	once, freed   sync.Once
	held, release chan struct{}
}

// free lets the held stream go on; calling it again does nothing.
func (p *holdFirstStream) free() { p.freed.Do(func() { close(p.release) }) }

func (p *holdFirstStream) Send(ctx context.Context, body []byte, opts llm.SendOptions) (*llm.Response, error) {
	if opts.OnDelta != nil {
		p.once.Do(func() {
			onDelta, first := opts.OnDelta, true
			opts.OnDelta = func(d llm.Delta) {
				onDelta(d)
				if first {
					first = false
					close(p.held)
					select {
					case <-p.release:
					case <-ctx.Done():
					}
				}
			}
		})
	}
	return p.Provider.Send(ctx, body, opts)
}
