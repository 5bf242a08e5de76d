// Package deltastream carries the deltas of streaming jobs from the worker that calls the
// provider to every API replica that holds a client's event stream, through Redis, never through
// Postgres: Postgres gets the one assembled result, as for any job.
//
// Each job has one Redis Stream, its buffer, at key <prefix>{<job id>}:deltas (the job ID is the
// hash tag, so the key has a slot of its own on Redis Cluster and every command touches one key).
// Its entries, in order:
//
//   - delta: a piece of an attempt's output: data {"attempt","offset","type","index","text"} and,
//     for a tool call's first piece, "tool_id" and "tool_name"; offset is the byte offset of text
//     within everything that attempt streamed (all types together);
//   - reset: the attempt streamed, failed, and a retry will start over: data {"attempt"}.
//
// Every entry carries its position: seq, the job's event sequence number of the attempt's
// "running" event, and n, 1, 2, ... within that attempt. (seq, n) orders entries among the job's
// status events, status event seq being (seq, 0), and is the SSE event id "seq.n".
//
// The buffer is bounded and expires: every write trims it to about Config.MaxLen entries
// (XADD MAXLEN ~) and sets its TTL (Config.TTL), so that a late or resuming client can catch up
// while nothing is kept for long; the job's end shortens it to Config.EndedTTL (Buffer.End). A
// client later than that misses what was trimmed; the terminal event still carries the whole
// result.
//
// Writers batch: Add never blocks the provider's stream; consecutive pieces of one block merge
// into one entry, and each writer's pending entries go in one script (XADD..., PEXPIRE,
// PUBLISH). The scripts of all the writers of a Buffer with something pending go together, in
// one pipelined round trip per round, one round at a time (so each writer's entries stay in
// order): a fast stream costs far fewer round trips than tokens, and many streams share them.
// With Config.Spacing, a writer written to less than Spacing ago waits for the flusher's next
// tick (every waiting writer in one round), and the pieces added meanwhile go as one entry:
// about one event per client per Spacing instead of one per token (the attempt's first piece
// never waits).
//
// The PUBLISH on channel <prefix>{<job id>}:deltas carries the entries themselves, with their
// IDs, to the API replicas that follow the job (Hub: one pub/sub connection per process). A
// follower appends them without reading Redis when the first is the entry right after the last
// it read (by seq and n), and reads the buffer (XRANGE) only when one may be missing.
package deltastream
