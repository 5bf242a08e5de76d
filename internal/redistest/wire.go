package redistest

import (
	"bufio"
	"bytes"
	"io"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

// Wire is a client of the test Redis whose commands a test reads back as they were sent: to pin
// the exact arguments a call puts on the wire, whatever Go values built them. Make it with
// NewWire; it is closed when the test ends.
type Wire struct {
	// Client sends through the recording proxy (one connection: commands are in order).
	Client *redis.Client

	mu   sync.Mutex
	sent []byte
}

// NewWire starts a recording proxy to the test Redis and a client through it.
func NewWire(t testing.TB) *Wire {
	t.Helper()
	w := &Wire{}
	p := NewProxy(t, func(_ *ProxyConn, b []byte) {
		w.mu.Lock()
		defer w.mu.Unlock()
		w.sent = append(w.sent, b...)
	}, nil)
	w.Client = redis.NewClient(&redis.Options{Addr: p.Addr(), PoolSize: 1})
	t.Cleanup(func() { _ = w.Client.Close() })
	return w
}

// Commands returns the commands sent since the last call (each its arguments as sent, bulk
// strings of RESP arrays), or fails the test if the bytes sent are not whole RESP arrays.
func (w *Wire) Commands(t testing.TB) [][]string {
	t.Helper()
	w.mu.Lock()
	sent := w.sent
	w.sent = nil
	w.mu.Unlock()
	r := bufio.NewReader(bytes.NewReader(sent))
	line := func() string {
		s, err := r.ReadString('\n')
		require.NoError(t, err, "read a RESP line")
		require.True(t, len(s) >= 3 && s[len(s)-2] == '\r', "a RESP line: %q", s)
		return s[:len(s)-2]
	}
	count := func(s string, kind byte) int {
		require.True(t, s[0] == kind, "want %q, got %q", kind, s)
		n, err := strconv.Atoi(s[1:])
		require.NoError(t, err, "a RESP length")
		return n
	}
	var cmds [][]string
	for {
		if _, err := r.Peek(1); err != nil {
			return cmds // io.EOF: every command read
		}
		n := count(line(), '*')
		cmd := make([]string, n)
		for i := range cmd {
			b := make([]byte, count(line(), '$')+2)
			_, err := io.ReadFull(r, b)
			require.NoError(t, err, "read a bulk string")
			cmd[i] = string(b[:len(b)-2])
		}
		cmds = append(cmds, cmd)
	}
}

// callID is a script call id (redisscript.CallIDs: 16 random hex digits, then a counter), alone
// or after a time.
var callID = regexp.MustCompile(`^((?:[0-9]+ )?)[0-9a-f]{16}[0-9a-z]{1,8}$`)

// EvalSHAs returns the EVALSHA commands sent since the last call, each its arguments joined by
// " | ", with each argument's call id (random per process) written "ID" and the strings old of
// r (a test's random key prefix, say) replaced.
func (w *Wire) EvalSHAs(t testing.TB, r *strings.Replacer) []string {
	t.Helper()
	var got []string
	for _, cmd := range w.Commands(t) {
		if !strings.EqualFold(cmd[0], "evalsha") {
			continue
		}
		for i, a := range cmd {
			cmd[i] = callID.ReplaceAllString(r.Replace(a), "${1}ID")
		}
		got = append(got, strings.Join(cmd, " | "))
	}
	return got
}

// CachedEvalSHAs runs calls twice, the first time for Redis to cache the scripts (a call may go
// as EVAL), and returns the second time's EVALSHA commands as EvalSHAs does.
func (w *Wire) CachedEvalSHAs(t testing.TB, r *strings.Replacer, calls func()) []string {
	t.Helper()
	calls()
	_ = w.Commands(t)
	calls()
	return w.EvalSHAs(t, r)
}
