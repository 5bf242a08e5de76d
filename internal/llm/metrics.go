package llm

import "github.com/prometheus/client_golang/prometheus"

// RegisterBudgetMetrics registers the gauges of b with reg: llmq_answer_budget_bytes (answer bytes
// held now), llmq_answer_budget_limit_bytes (the bound) and llmq_answer_budget_waiting_calls (calls
// waiting for room: a budget that is too small for the load shows here). It panics if they are
// already registered there, a programming error.
func RegisterBudgetMetrics(reg prometheus.Registerer, b *AnswerBudget) {
	reg.MustRegister(
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "llmq_answer_budget_bytes",
			Help: "Bytes of provider answers this worker process holds now (bounded by worker.max_answer_bytes).",
		}, func() float64 { return float64(b.InUse()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "llmq_answer_budget_limit_bytes",
			Help: "The bound on bytes of provider answers held at once by this worker process (worker.max_answer_bytes).",
		}, func() float64 { return float64(b.Total()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "llmq_answer_budget_waiting_calls",
			Help: "Provider calls of this worker process waiting for room for their answer.",
		}, func() float64 { return float64(b.Waiting()) }),
	)
}
