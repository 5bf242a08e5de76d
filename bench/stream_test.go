package main

import (
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestLags proves that each token's lag runs from its flush to the read of the delta event that
// completes it, and that the steady lags count only tokens flushed after the first delta read.
func TestLags(t *testing.T) {
	t0 := time.Unix(0, 0)
	ms := func(n int) time.Time { return t0.Add(time.Duration(n) * time.Millisecond) }
	v := &jobView{}
	v.delta(0, "abcd", ms(10))   // completes token 1 (flushed at 1)
	v.delta(4, "efghij", ms(40)) // completes tokens 2 and 3 (flushed at 20 and 30)
	all, steady := lags(nil, nil, []int{4, 8, 10, 12}, []time.Time{ms(1), ms(20), ms(30), ms(35)}, v)
	require.Equal(t, []time.Duration{9 * time.Millisecond, 20 * time.Millisecond, 10 * time.Millisecond}, all,
		"the token the client never got is skipped")
	require.Equal(t, []time.Duration{20 * time.Millisecond, 10 * time.Millisecond}, steady)
	require.Zero(t, v.gaps)

	v.delta(3, "x", ms(50))
	require.Equal(t, 1, v.gaps, "an offset that does not follow the text read")
	_, err := v.event("reset", nil, ms(60))
	require.NoError(t, err)
	require.Empty(t, v.text)
}

// TestRecordingWriter proves that the simulator's content tokens are recorded with their text
// at each flush, and other events ignored.
func TestRecordingWriter(t *testing.T) {
	c := &simCall{}
	w := &recordingWriter{ResponseWriter: httptest.NewRecorder(), call: c}
	_, _ = w.Write([]byte("event: ping\ndata: {}\n\nevent: content_block_delta\ndata: {\"delta\":{\"type\":\"text_delta\",\"text\":\"ab\"}}\n\nevent: content_block_delta\ndata: {\"delta\""))
	require.NoError(t, w.FlushError())
	_, _ = w.Write([]byte(":{\"type\":\"text_delta\",\"text\":\"cd\"}}\n\n"))
	require.NoError(t, w.FlushError())
	text, ends, at := c.snapshot()
	require.Equal(t, "abcd", string(text))
	require.Equal(t, []int{2, 4}, ends)
	require.Len(t, at, 2)
}
