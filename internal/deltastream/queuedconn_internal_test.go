package deltastream

import (
	"bytes"
	"io"
	"net"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestQueuedConn_AWriteQueuedBehindAHeldOneHasItsWholeTime: a write queued while the one
// before it is held (the peer reads nothing for a while) gets the time it was given from when
// its own write starts, as when go-redis wrote it itself (the hub sends a command only once
// the one before was handed over): a hold shorter than each write's time fails none, where
// counting the wait in the queue failed the later one and cost a reconnect (an UNSUBSCRIBE,
// given 1 s, queued behind a SUBSCRIBE, given 2 s, that waited more than 1 s).
func TestQueuedConn_AWriteQueuedBehindAHeldOneHasItsWholeTime(t *testing.T) {
	client, server := net.Pipe() // nothing reads server until the later write's time has passed
	defer server.Close()
	q := newQueuedConn(client)
	defer q.Close()
	first, later := []byte("SUBSCRIBE a"), []byte("UNSUBSCRIBE b")
	require.NoError(t, q.SetWriteDeadline(time.Now().Add(20*time.Second)))
	_, err := q.Write(first)
	require.NoError(t, err)
	laterTime := 250 * time.Millisecond
	require.NoError(t, q.SetWriteDeadline(time.Now().Add(laterTime)))
	_, err = q.Write(later)
	require.NoError(t, err)
	<-time.After(2 * laterTime) // the later write's deadline, counted from its Write, has passed

	require.NoError(t, server.SetReadDeadline(time.Now().Add(10*time.Second)))
	got := make([]byte, len(first)+len(later))
	_, err = io.ReadFull(server, got)
	require.NoError(t, err, "both writes reach the peer")
	require.Equal(t, append(append([]byte(nil), first...), later...), got)
	_, err = q.Write([]byte("PING"))
	require.NoError(t, err, "the connection did not fail")
}

// TestQueuedConn_ACommandLargerThanTheBoundGoesThrough: a command bigger than queuedMax (a
// resubscription to tens of thousands of channels, written in go-redis's 32 KiB chunks) goes
// through a peer slower to take it than Go is to copy it (any network): Write waits for room
// once queuedMax bytes wait, where failing the connection failed every resubscription, and
// the hub connected again and again, subscribed to nothing.
func TestQueuedConn_ACommandLargerThanTheBoundGoesThrough(t *testing.T) {
	client, server := net.Pipe() // nothing reads server until queuedMax bytes wait
	defer server.Close()
	q := newQueuedConn(client)
	defer q.Close()
	cmd := make([]byte, 2*queuedMax)
	for i := range cmd {
		cmd[i] = byte(i % 251)
	}
	require.NoError(t, q.SetWriteDeadline(time.Now().Add(20*time.Second)))
	written := make(chan error, 1)
	go func() {
		for chunk := range slices.Chunk(cmd, 32<<10) {
			if _, err := q.Write(chunk); err != nil {
				written <- err
				return
			}
		}
		written <- nil
	}()
	require.Eventually(t, func() bool {
		q.mu.Lock()
		defer q.mu.Unlock()
		return q.queued+32<<10 > queuedMax || q.err != nil
	}, 30*time.Second, time.Millisecond, "queuedMax bytes wait")

	_ = server.SetReadDeadline(time.Now().Add(10 * time.Second)) // fails on a closed pipe: so does the read
	got := make([]byte, len(cmd))
	_, readErr := io.ReadFull(server, got)
	select {
	case err := <-written:
		require.NoError(t, err, "the command was handed over whole")
	case <-time.After(30 * time.Second):
		t.Fatal("the command's Write never returned")
	}
	require.NoError(t, readErr)
	require.True(t, bytes.Equal(cmd, got), "the peer read the command, in order")
}

// TestQueuedConn_AWriteWaitingForRoomFailsWithTheConnection: a Write waiting for room (the
// peer reads nothing) returns when the write held fails at its deadline, with its error; the
// connection is closed.
func TestQueuedConn_AWriteWaitingForRoomFailsWithTheConnection(t *testing.T) {
	client, server := net.Pipe()
	defer server.Close()
	q := newQueuedConn(client)
	defer q.Close()
	require.NoError(t, q.SetWriteDeadline(time.Now().Add(100*time.Millisecond)))
	chunk := make([]byte, 64<<10)
	var err error
	for i := 0; err == nil && i <= queuedMax/len(chunk); i++ {
		_, err = q.Write(chunk) // the last one waits for room, until the held write fails
	}
	require.ErrorIs(t, err, os.ErrDeadlineExceeded)
	_ = q.SetReadDeadline(time.Now().Add(5 * time.Second)) // fails on the closed pipe
	_, err = q.Read(make([]byte, 1))
	require.ErrorIs(t, err, io.ErrClosedPipe, "the failed write closed the connection")
}
