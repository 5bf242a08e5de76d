package dispatch

import (
	"slices"

	"github.com/llmq/llmq/internal/jobs"
)

// Queues names the asynq queues of one llmq queue (config worker.queue): low jobs have a queue of
// their own, "<queue>:low", so that a normal or high job never waits in asynq behind a low
// backlog (batch work); high and normal jobs share the queue's own name (tasks enqueued before
// there were two queues are still served), where the limiter, not asynq, puts high first. A low
// job's delivery that must come back later (the limiter's turn, a retry's delay) comes back on
// the main queue (see Mux).
//
// asynq's queues are FIFO lists. With one queue, an interactive job submitted behind 100,000
// batch jobs waited until the workers had taken every task before it (each is taken, asks the
// limiter, and is deferred: 160-216 s on the bench machine), however the limiter ranked it.
// Two queues and not more: asynq asks the queues one Redis round trip each, in its weighted
// random order, until one has a task, so every queue that is usually empty costs round trips on
// the hot path (one queue per priority: 0.9 empty asks per dequeue with only normal jobs, and
// 20% more worker and Redis CPU per job at full throttle; two, weighted 9:1: 0.1; a third for
// deferred deliveries: 0.5 more per dequeue while only low jobs wait, and a low backlog drained
// 0.82 × as fast as with one queue).
type Queues struct{ base string }

// NewQueues returns the queues of the llmq queue named base.
func NewQueues(base string) Queues { return Queues{base: base} }

// For returns the asynq queue of priority p's jobs; an empty or unknown p is normal.
func (q Queues) For(p jobs.Priority) string {
	if p == jobs.PriorityLow {
		return q.base + ":low"
	}
	return q.base
}

// Due returns the asynq queue on which a low job's deferred delivery waits for its time: the
// main queue (see Mux).
func (q Queues) Due() string { return q.base }

// All returns every asynq queue, the main one first.
func (q Queues) All() []string {
	return []string{q.base, q.For(jobs.PriorityLow)}
}

// placedTask is a task ID on an asynq queue.
type placedTask struct{ queue, id string }

// tasksOf returns where a job's task may wait: under the job's ID on the main or the low queue,
// as its due task on the main queue, and as its rescue task on either (see
// Enqueuer.EnqueueRescue). A rescue task may carry its job for the rest of its life (a dead
// job retried while its task was still active runs under one, see Tasks.Requeue): a cancel
// must reach it as it reaches the others.
func (q Queues) tasksOf(jobID string) []placedTask {
	return []placedTask{{q.base, jobID}, {q.For(jobs.PriorityLow), jobID}, {q.Due(), jobID + dueSuffix},
		{q.base, jobID + rescueSuffix}, {q.For(jobs.PriorityLow), jobID + rescueSuffix}}
}

// contains reports whether name is one of the queues.
func (q Queues) contains(name string) bool { return slices.Contains(q.All(), name) }

// weights are the asynq server's weights, 9:1. They only decide which waiting task a free
// delivery slot takes next; the shares of the provider's limit are the limiter's fair queue's
// (config fairness). Weighted, not strict: a strict order would leave low tasks in Redis while
// the main queue has a backlog, so they could never reach the limiter to claim the minimum
// share it keeps for them.
func (q Queues) weights() map[string]int {
	return map[string]int{q.base: 9, q.For(jobs.PriorityLow): 1}
}
