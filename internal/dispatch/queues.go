package dispatch

import (
	"github.com/llmq/llmq/internal/jobs"
)

// Queues names the asynq queues of one llmq queue (config worker.queue): one per priority, so
// that a job never waits in asynq behind a backlog of a lower priority. Normal jobs use the
// queue's own name (tasks enqueued before there were priority queues are still served); high
// and low jobs use the name with ":high" and ":low" appended.
//
// asynq's queues are FIFO lists. With one queue, an interactive job submitted behind 100,000
// batch jobs waited until the workers had taken every task before it (each is taken, asks the
// limiter, and is deferred: about 1,000 a second), minutes, however the limiter ranked it.
type Queues struct{ base string }

// NewQueues returns the queues of the llmq queue named base.
func NewQueues(base string) Queues { return Queues{base: base} }

// For returns the asynq queue of priority p's jobs; an empty or unknown p is normal.
func (q Queues) For(p jobs.Priority) string {
	switch p {
	case jobs.PriorityHigh, jobs.PriorityLow:
		return q.base + ":" + string(p)
	}
	return q.base
}

// All returns every asynq queue, highest priority first.
func (q Queues) All() []string {
	return []string{q.For(jobs.PriorityHigh), q.For(jobs.PriorityNormal), q.For(jobs.PriorityLow)}
}

// contains reports whether name is one of the queues.
func (q Queues) contains(name string) bool {
	return name == q.base || name == q.For(jobs.PriorityHigh) || name == q.For(jobs.PriorityLow)
}

// queueWeights are the asynq server's weights (high 6, normal 3, low 1: asynq's own example).
// They only decide which waiting task a free delivery slot takes next; the shares of the
// provider's limit are the limiter's fair queue's (config fairness). Weighted, not strict: a
// strict order would leave a lower priority's tasks in Redis while a higher one has a backlog,
// so they could never reach the limiter to claim the minimum share it keeps for them.
func (q Queues) weights() map[string]int {
	return map[string]int{q.For(jobs.PriorityHigh): 6, q.For(jobs.PriorityNormal): 3, q.For(jobs.PriorityLow): 1}
}
