package batchlane

import (
	"context"
	"time"
)

// CrashAfterCommit makes b's passes end with err between a batch's commit and its send, as a
// process dying there would.
func CrashAfterCommit(b *Batcher, err error) { b.crashAfterCommit = err }

// SetMaxAnswerLen sets how much of a 2xx answer c reads (1 GiB by default).
func SetMaxAnswerLen(c Client, n int64) {
	switch c := c.(type) {
	case *anthropicClient:
		c.maxAnswer = n
	case *openAIClient:
		c.maxAnswer = n
	}
}

// CrashAfterRecord makes b's passes end with err between the recording of an ended batch's
// results and the batch's close, as a process dying there would.
func CrashAfterRecord(b *Batcher, err error) { b.crashAfterRecord = err }

// ExpiredMessage is the error of an expired batch request's attempt row.
const ExpiredMessage = expiredMessage

// CrashAfterClose makes b's passes end with err between a batch's close and the deletes of its
// files, as a process dying there would.
func CrashAfterClose(b *Batcher, err error) { b.crashAfterClose = err }

// MaxFileDeleteAttempts is how many times a batch file's delete is tried.
const MaxFileDeleteAttempts = maxFileDeleteAttempts

// FileDeletesPerPass is how many batch files one pass deletes at most.
const FileDeletesPerPass = fileDeletesPerPass

// OldGiveUpsPerPass is how many files given up by a leader of the last release one pass moves
// out of its range at most.
const OldGiveUpsPerPass = oldGiveUpsPerPass

// AfterUpload makes b run f between an upload's answer and its record: runtime.Goexit ends the
// pass there, as a process dying there would; a function that blocks holds the record back.
func AfterUpload(b *Batcher, f func()) { b.afterUpload = f }

// SetSweepTimeout sets the time a pass of b gives its listings of uploads, together.
func SetSweepTimeout(b *Batcher, d time.Duration) { b.sweepTimeout = d }

// Lead runs b's lead (a pass every Tick) until ctx ends, as when b's process takes the lead.
func Lead(ctx context.Context, b *Batcher) error { return b.lead(ctx) }
