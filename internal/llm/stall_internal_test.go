package llm

import (
	"context"
	"io"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// endless is a body that always has bytes.
type endless struct{}

func (endless) Read(p []byte) (int, error) { return len(p), nil }
func (endless) Close() error               { return nil }

// TestStallReader_ReadAllocs: with a stall timeout set, each read of the body resets and stops
// one timer and allocates nothing (the reader and its timer are made once per call).
func TestStallReader_ReadAllocs(t *testing.T) { // not parallel: AllocsPerRun counts every goroutine's allocations
	fired := make(chan error, 1)
	s := newStallReader(endless{}, time.Hour, func(cause error) { fired <- cause })
	defer s.timer.Stop()
	buf := make([]byte, 512)
	allocs := testing.AllocsPerRun(1000, func() {
		if _, err := s.Read(buf); err != nil {
			t.Fatal(err)
		}
	})
	require.Zero(t, allocs, "allocations per read")
	require.Empty(t, fired)
}

// TestStallReader_OnlyAReadsWaitCounts: the time the caller spends between reads (emitting a
// delta, waiting for room in the answer budget) is not the provider's stall; a read that waits
// longer than the timeout is.
func TestStallReader_OnlyAReadsWaitCounts(t *testing.T) {
	t.Parallel()

	const after = 20 * time.Millisecond
	fired := make(chan error, 1)
	pr, pw := io.Pipe()
	s := newStallReader(pr, after, func(cause error) {
		fired <- cause
		_ = pw.CloseWithError(cause)
	})
	defer s.timer.Stop()
	go func() {
		_, _ = pw.Write([]byte("{"))
		_, _ = pw.Write([]byte("}"))
	}()
	buf := make([]byte, 8)
	n, err := s.Read(buf) // the first byte: the body has begun
	require.NoError(t, err)
	require.Equal(t, 1, n)
	// The caller is busy for five times the timeout; the next byte is already waiting.
	time.Sleep(5 * after)
	require.Empty(t, fired, "the caller's own time fired the stall timer")
	n, err = s.Read(buf)
	require.NoError(t, err)
	require.Equal(t, 1, n)

	// Nothing more comes: the next read waits past the timeout and the call is ended.
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	_, err = s.Read(buf)
	require.ErrorIs(t, err, ErrStallTimeout)
	select {
	case cause := <-fired:
		require.ErrorIs(t, cause, ErrStallTimeout)
		require.EqualError(t, cause, "no new answer byte for 20ms after the body began (stall timeout)")
	case <-ctx.Done():
		t.Fatal("the stall timer did not fire")
	}
	_ = pw.Close()
}

// BenchmarkStallReader_Read is the cost a stall timeout adds to each read of a body: a timer
// reset and stop (Off reads the body alone, as a call without one does).
func BenchmarkStallReader_Read(b *testing.B) {
	buf := make([]byte, 512)
	b.Run("Off", func(b *testing.B) {
		var r io.Reader = endless{}
		b.ReportAllocs()
		for b.Loop() {
			_, _ = r.Read(buf)
		}
	})
	b.Run("On", func(b *testing.B) {
		s := newStallReader(endless{}, time.Hour, func(error) {})
		defer s.timer.Stop()
		b.ReportAllocs()
		for b.Loop() {
			_, _ = s.Read(buf)
		}
	})
}
