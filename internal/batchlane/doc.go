// Package batchlane is the batch lane: jobs submitted with "lane": "batch" (or "auto" with room
// for the window) go through the providers' batch APIs, Anthropic Message Batches and OpenAI
// Batch, at half the online price and outside the online rate limits. They are never asynq
// tasks and never take an online limiter slot; the Batcher, run by one leader among the
// workers, owns them:
//
//  1. collect: a credential's waiting jobs, per model, become a batch when MaxRequestsPerBatch
//     (or Lane.MaxBytes of requests, the providers' cap) are waiting or the oldest has waited
//     MaxWaitToFill;
//  2. commit: the batch row and its jobs' batch_ref are committed in one transaction BEFORE
//     the batch is sent, so a job is in one batch at a time;
//  3. send: the first send freezes the batch's jobs (those canceled meanwhile leave it) and
//     records when it began; a send again (after a crash or a failed call) first looks the
//     batch up at the provider (OpenAI: by metadata; Anthropic: by the last send's start and
//     size, each send recording its own),
//     and sends only if the provider has none, so a crash does not pay for a job twice;
//  4. poll: with backoff (PollInterval doubling to 10 ×), until the batch ended;
//  5. record: each job's result by custom_id (the job ID), mapped onto the online classes
//     (see Batcher.record); jobs left for the online lane are enqueued. Then the batch is
//     closed, with its files at the provider (OpenAI's input, output and error files);
//  6. delete: the files of closed batches (each upload recorded before its batch is created,
//     so a lost batch's too) and the uploads no batch reads (a create that failed, sent again)
//     are deleted by the pass, a failed delete tried again with a backoff, a bounded number of
//     times (provider_batch_files, migration 024).
//
// Deadlines hold whatever a batch does: a job whose deadline is within OnlineFallback, waiting
// or in a batch not yet ended, goes to the online lane (a result its batch brings later is
// discarded; the provider may still charge for it); one in a batch with no attempt left fails,
// deadline_exceeded. A canceled job leaves its batch before the send; after it, its result is
// discarded (an answer's usage is kept as the job's: the provider charged for it), and a batch
// none of whose jobs still wait is canceled at the provider, polled until the provider ends it
// (its answers' usage kept as the canceled jobs'), and then closed and its files deleted. A
// credential whose lane is turned off sends its waiting jobs online and still polls the batches
// it has; a paused credential (a spend cap) sends no batch until it is
// resumed (by an operator, or by a pause probe: the online lane's, or, with the credential's
// pause_probe_interval, one batch send per interval), and still polls the batches it sent. A
// send the batch API refuses with a spend cap (a 429 without Retry-After, or a spend-cap code, as
// the online lane classifies answers) pauses the credential and alerts, as the executor does;
// so does a request an ended batch answered with a spend-cap code, whose job is dead-lettered,
// and a batch that failed as a whole with one, whose jobs are (without an attempt counted):
// the pause comes before the dead letters, which a pause Redis refused holds back until a later
// poll pauses the credential.
// A batch the provider refuses as a whole (4xx, or OpenAI's failed) sends its jobs online; one
// it no longer knows (404) sends them round again; failed calls (send, poll, results, cancel)
// keep the backoff, or wait the answer's longer Retry-After, at most the backoff's cap.
package batchlane
