package batchlane

// CrashAfterCommit makes b's passes end with err between a batch's commit and its send, as a
// process dying there would.
func CrashAfterCommit(b *Batcher, err error) { b.crashAfterCommit = err }
