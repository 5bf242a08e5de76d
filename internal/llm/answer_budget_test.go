package llm_test

import (
	"context"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/llm"
)

// answer is a 2xx body of n bytes.
func answer(n int) string {
	const wrap = `{"content":""}`
	return `{"content":"` + strings.Repeat("x", n-len(wrap)) + `"}`
}

// waitFor polls cond until it holds, failing after testWait or as soon as stop (when not nil)
// has something to receive.
func waitFor(t *testing.T, what string, cond func() bool, stop <-chan error) {
	t.Helper()
	deadline := time.Now().Add(testWait)
	for !cond() {
		select {
		case err := <-stop:
			t.Fatalf("before %s: the call returned (%v)", what, err)
		default:
		}
		require.True(t, time.Now().Before(deadline), "timed out waiting for %s", what)
		time.Sleep(time.Millisecond)
	}
}

// The bytes of answers held at once are bounded: with a budget smaller than two answers, a
// second call waits (before sending anything) until the first answer is released, then goes on;
// a call whose context ends while it waits fails and holds nothing.
func TestAnswerBudget_SecondAnswerWaitsForTheFirst(t *testing.T) {
	t.Parallel()

	const size = 40 << 10
	budget, err := llm.NewAnswerBudget(64<<10, 48<<10) // one answer of 40 KiB fits, two do not
	require.NoError(t, err)
	arrived := make(chan struct{}, 10)
	b := setup(t, llm.KindAnthropic, func(w http.ResponseWriter, r *http.Request) {
		arrived <- struct{}{}
		reply(200, answer(size))(w, r)
	}, bundleOpts{maxBytes: 48 << 10, budget: budget})

	// Given one answer held
	first, err := b.provider.Send(callContext(t), bodyFor(llm.KindAnthropic), llm.SendOptions{})
	require.NoError(t, err)
	require.Len(t, first.Body, size)
	require.Equal(t, int64(size), budget.InUse(), "the answer holds its bytes, no more")
	within(t, arrived, "first request")

	// When a second call starts, it waits for room before it sends anything.
	done := make(chan error, 1)
	var second *llm.Response
	go func() {
		var err error
		second, err = b.provider.Send(callContext(t), bodyFor(llm.KindAnthropic), llm.SendOptions{})
		done <- err
	}()
	waitFor(t, "the second call to wait", func() bool { return budget.Waiting() == 1 }, done)
	require.Empty(t, arrived, "the provider has not been called")

	// A third whose context ends while it waits fails, holding nothing.
	ctx, cancel := context.WithCancel(callContext(t))
	third := make(chan error, 1)
	go func() {
		_, err := b.provider.Send(ctx, bodyFor(llm.KindAnthropic), llm.SendOptions{})
		third <- err
	}()
	waitFor(t, "the third call to wait", func() bool { return budget.Waiting() == 2 }, third)
	cancel()
	require.ErrorIs(t, within(t, third, "end of the canceled call"), context.Canceled)
	require.Equal(t, int64(size), budget.InUse())

	// Then once the first answer is released, the second call goes on and holds its own.
	first.Release()
	require.NoError(t, within(t, done, "end of the second call"))
	within(t, arrived, "second request")
	require.Len(t, second.Body, size)
	require.Equal(t, int64(size), budget.InUse())
	require.Equal(t, 0, budget.Waiting())
	second.Release()
	second.Release() // a second Release is a no-op
	require.Zero(t, budget.InUse())
	require.Len(t, second.Body, size, "the body stays valid after Release")
}

// Answers grow as they are read, and their size is not known beforehand (no Content-Length): a
// call holding part of an answer can find no room to grow. The reserve (the largest answer) lets
// one call at a time grow without waiting, so calls never wait for each other for ever: here the
// first call holds the whole shared part while its answer is late, the second takes the reserve
// and finishes, the first waits to grow until the second's answer is released, then finishes.
func TestAnswerBudget_GrowingAnswersNeverDeadlock(t *testing.T) {
	t.Parallel()

	const size = 100 << 10
	budget, err := llm.NewAnswerBudget(192<<10, 128<<10) // 64 KiB shared, a reserve of 128 KiB
	require.NoError(t, err)
	release := make(chan struct{})
	arrived := make(chan string, 2)
	b := setup(t, llm.KindOpenAI, func(w http.ResponseWriter, r *http.Request) {
		which := r.Header.Get("X-Test-Call")
		arrived <- which
		if which == "late" {
			<-release
		}
		w.Header().Set("Content-Type", "application/json")
		w.(http.Flusher).Flush() // chunked: no Content-Length, the reader grows as it goes
		_, _ = w.Write([]byte(answer(size)))
	}, bundleOpts{maxBytes: 128 << 10, budget: budget, wrap: func(rt http.RoundTripper) http.RoundTripper {
		return roundTripFunc(func(r *http.Request) (*http.Response, error) {
			r = r.Clone(r.Context())
			r.Header.Set("X-Test-Call", r.Context().Value(callKey{}).(string))
			return rt.RoundTrip(r)
		})
	}})
	var releaseOnce sync.Once
	letGo := func() { releaseOnce.Do(func() { close(release) }) }
	t.Cleanup(letGo) // before the server's Close (cleanups run last first): a failing test must not hang
	send := func(which string) (*llm.Response, error) {
		ctx := context.WithValue(callContext(t), callKey{}, which)
		return b.provider.Send(ctx, bodyFor(llm.KindOpenAI), llm.SendOptions{})
	}

	// Given a call that holds the shared 64 KiB while its answer is late
	lateDone := make(chan error, 1)
	var late *llm.Response
	go func() {
		var err error
		late, err = send("late")
		lateDone <- err
	}()
	require.Equal(t, "late", within(t, arrived, "late request"))
	require.Equal(t, int64(64<<10), budget.InUse())

	// When a second call comes, it takes the reserve and reads its whole answer
	prompt, err := send("prompt")
	require.NoError(t, err)
	require.Equal(t, "prompt", within(t, arrived, "prompt request"))
	require.Len(t, prompt.Body, size)

	// and the late answer, once it comes, waits for room to grow
	letGo()
	waitFor(t, "the late answer to wait for room", func() bool { return budget.Waiting() == 1 }, lateDone)
	require.LessOrEqual(t, budget.InUse(), int64(192<<10))

	// until the second answer is released.
	prompt.Release()
	require.NoError(t, within(t, lateDone, "end of the late call"))
	require.Len(t, late.Body, size)
	late.Release()
	require.Zero(t, budget.InUse())
}

// callKey carries a test call's name to the test transport.
type callKey struct{}

func TestNewAnswerBudget(t *testing.T) {
	t.Parallel()

	_, err := llm.NewAnswerBudget(1<<20, 2<<20)
	require.ErrorContains(t, err, "smaller than the largest answer")
	_, err = llm.NewAnswerBudget(32<<10, 1<<10)
	require.ErrorContains(t, err, "smaller than the largest answer", "an error body (64 KiB) must fit too")
	budget, err := llm.NewAnswerBudget(1<<20, 1<<20)
	require.NoError(t, err)
	_, err = llm.New(llm.Config{Kind: llm.KindOpenAI, BaseURL: "http://127.0.0.1:1", AnswerBudget: budget})
	require.ErrorContains(t, err, "MaxResponseBytes", "the default 32 MiB answer does not fit a 1 MiB budget")
	_, err = llm.New(llm.Config{Kind: llm.KindOpenAI, BaseURL: "http://127.0.0.1:1", AnswerBudget: budget, MaxResponseBytes: 1 << 20})
	require.NoError(t, err)
}
