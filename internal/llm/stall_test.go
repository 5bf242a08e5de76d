package llm_test

import (
	"context"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/llm"
	"github.com/llmq/llmq/internal/llmsim"
	"github.com/llmq/llmq/internal/retrypolicy"
)

// TestProvider_Send_StallTimeout: an answer whose body began, then stalled, held its worker
// slot and its credential's send slot until the attempt's deadline (5m by default).
// SendOptions.StallTimeout ends it once a read waits that long for the next byte, as a timeout;
// a body that keeps coming, however slowly, is not a stall.
func TestProvider_Send_StallTimeout(t *testing.T) {
	t.Parallel()

	const stall = 100 * time.Millisecond

	// stalled sends headers and the body's first bytes at once, then nothing until the client
	// goes; gone is closed then.
	stalled := func(gone chan struct{}) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(200)
			_, _ = io.WriteString(w, `{"usage":`)
			w.(http.Flusher).Flush()
			<-r.Context().Done()
			close(gone)
		}
	}

	t.Run("EndsABodyStalledAfterItsFirstBytes", func(t *testing.T) {
		t.Parallel()

		gone := make(chan struct{})
		b := setup(t, llm.KindAnthropic, stalled(gone))
		start := time.Now()
		_, err := b.provider.Send(callContext(t), bodyFor(llm.KindAnthropic), llm.SendOptions{StallTimeout: stall})
		elapsed := time.Since(start)
		require.ErrorIs(t, err, llm.ErrStallTimeout)
		require.NotErrorIs(t, err, llm.ErrFirstByteTimeout)
		require.NotErrorIs(t, err, context.Canceled)
		te := asTransportError(t, err)
		require.True(t, te.Timeout())
		require.Equal(t, http.StatusOK, te.StatusCode, "the provider answered")
		require.Positive(t, te.TimeToFirstByte, "its body began")
		require.ErrorContains(t, err, "no new answer byte for 100ms after the body began")
		require.Equal(t, retrypolicy.ClassTimeout, retrypolicy.Classify(err, testNow).Class)
		require.GreaterOrEqual(t, elapsed, stall)
		require.Less(t, elapsed, 10*time.Second, "the stall, not the call's deadline, ended it")
		within(t, gone, "abort seen by the server")
	})

	t.Run("EndsAStreamStalledAfterItsFirstDelta", func(t *testing.T) {
		t.Parallel()

		p, sim := simProvider(t, llm.KindOpenAI, llmsim.Config{})
		require.NoError(t, sim.SetFaults(llmsim.Faults{StreamFailNext: 1, StreamFailAfter: 1, StreamFailMode: llmsim.StreamFailStall}))
		var got deltas
		_, err := p.Send(callContext(t), streamBody(llm.KindOpenAI), llm.SendOptions{StallTimeout: stall, OnDelta: got.add})
		require.ErrorIs(t, err, llm.ErrStallTimeout)
		te := asTransportError(t, err)
		require.Equal(t, http.StatusOK, te.StatusCode)
		require.Positive(t, te.TimeToFirstByte, "a delta came")
		require.NotEmpty(t, got.text(llm.DeltaText))
		require.Equal(t, retrypolicy.ClassTimeout, retrypolicy.Classify(err, testNow).Class)
	})

	t.Run("ASlowSteadyBodyIsNoStall", func(t *testing.T) {
		t.Parallel()

		// 12 pieces a quarter of the stall timeout apart: the body takes three times the stall
		// timeout, each gap is well within it.
		const pieces, gap = 12, stall / 4
		b := setup(t, llm.KindAnthropic, func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(200)
			for range pieces {
				_, _ = io.WriteString(w, " ")
				w.(http.Flusher).Flush()
				select {
				case <-time.After(gap):
				case <-r.Context().Done():
					return
				}
			}
			_, _ = io.WriteString(w, `{"usage":{"input_tokens":1,"output_tokens":1}}`)
		})
		start := time.Now()
		resp, err := b.provider.Send(callContext(t), bodyFor(llm.KindAnthropic), llm.SendOptions{StallTimeout: stall})
		require.NoError(t, err)
		require.Equal(t, 1, resp.Usage.OutputTokens)
		require.Greater(t, time.Since(start), stall, "the whole body took longer than the stall timeout")
	})

	t.Run("OffLeavesAPauseAlone", func(t *testing.T) {
		t.Parallel()

		// The body begins, pauses three times what a stall timeout would allow, then ends.
		b := setup(t, llm.KindAnthropic, pausedBody(3*stall))
		resp, err := b.provider.Send(callContext(t), bodyFor(llm.KindAnthropic), llm.SendOptions{})
		require.NoError(t, err)
		require.Equal(t, 1, resp.Usage.OutputTokens)
	})

	t.Run("WaitsForTheBodyToBegin", func(t *testing.T) {
		t.Parallel()

		// Headers at once, no body byte: the first-byte timeout's case, not the stall's. With a
		// stall timeout shorter than the first-byte one, the first-byte timeout still ends it.
		b := setup(t, llm.KindAnthropic, func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(200)
			w.(http.Flusher).Flush()
			<-r.Context().Done()
		})
		_, err := b.provider.Send(callContext(t), bodyFor(llm.KindAnthropic),
			llm.SendOptions{StallTimeout: stall / 4, FirstByteTimeout: stall})
		require.ErrorIs(t, err, llm.ErrFirstByteTimeout)
		require.NotErrorIs(t, err, llm.ErrStallTimeout)
		require.NotContains(t, err.Error(), "stall")
	})
}
