package redisscript

import (
	"crypto/rand"
	"encoding/hex"
	"strconv"
	"sync/atomic"
	"time"
)

// CallKeep is how long a script keeps what a call did under the call's id (CallIDs): longer than
// go-redis's retries of one call take (3 retries, each after at most 512ms of backoff and a read
// timeout: 5 s in llmq's clients, about 22 s in all).
const CallKeep = 30 * time.Second

// CallIDs names script calls, each id unique among the calls of every process. go-redis sends a
// call again, on a new connection, when its reply was lost with the connection (a failover, a
// proxy restart, CLIENT KILL): Redis may have run it already. A script that must not do its work
// twice (take a second slot, count a failure twice) keeps what a call did under its id for
// CallKeep, in a key of the caller's hash slot, and a call that finds it does nothing again. It is
// safe for concurrent use.
type CallIDs struct {
	prefix string
	n      atomic.Uint64
}

// NewCallIDs returns the call ids of one client (random, so that no two processes share one).
func NewCallIDs() *CallIDs {
	var b [8]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (Go 1.24+)
	return &CallIDs{prefix: hex.EncodeToString(b[:])}
}

// Next returns a new call id.
func (c *CallIDs) Next() string { return c.prefix + strconv.FormatUint(c.n.Add(1), 36) }

// append appends a new call id (Next's) to b.
func (c *CallIDs) append(b []byte) []byte {
	return strconv.AppendUint(append(b, c.prefix...), c.n.Add(1), 36)
}
