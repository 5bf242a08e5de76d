package main

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/llmq/llmq/internal/executor"
)

// stageMetric is the worker's histogram of where a delivery's time goes.
const stageMetric = "llmq_delivery_stage_duration_seconds"

// stageTotal is one delivery stage's histogram totals.
type stageTotal struct {
	count uint64
	sum   float64 // seconds
}

// stageTime is a stage's share of the measured jobs.
type stageTime struct {
	stage  string
	count  uint64
	meanMS float64
}

// addStageTotals adds stageMetric's series in mfs to into.
func addStageTotals(into map[string]stageTotal, mfs []*dto.MetricFamily) {
	for _, mf := range mfs {
		if mf.GetName() != stageMetric {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "stage" {
					t := into[l.GetValue()]
					t.count += m.GetHistogram().GetSampleCount()
					t.sum += m.GetHistogram().GetSampleSum()
					into[l.GetValue()] = t
				}
			}
		}
	}
}

// scrapeStageTotals reads stageMetric from the /metrics endpoints at addrs (host:port) and sums it.
func scrapeStageTotals(ctx context.Context, hc *http.Client, addrs []string) (map[string]stageTotal, error) {
	out := map[string]stageTotal{}
	if err := scrapeMetrics(ctx, hc, addrs, func(mfs []*dto.MetricFamily) { addStageTotals(out, mfs) }); err != nil {
		return nil, err
	}
	return out, nil
}

// scrapeMetrics reads the /metrics endpoints at addrs (host:port) and hands each one's metric
// families to add.
func scrapeMetrics(ctx context.Context, hc *http.Client, addrs []string, add func([]*dto.MetricFamily)) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	for _, addr := range addrs {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/metrics", nil)
		if err != nil {
			return err
		}
		resp, err := hc.Do(req)
		if err != nil {
			return fmt.Errorf("scrape %s: %w", addr, err)
		}
		parser := expfmt.NewTextParser(model.UTF8Validation)
		fams, err := parser.TextToMetricFamilies(resp.Body)
		resp.Body.Close()
		if err != nil {
			return fmt.Errorf("scrape %s: %w", addr, err)
		}
		mfs := make([]*dto.MetricFamily, 0, len(fams))
		for _, mf := range fams {
			mfs = append(mfs, mf)
		}
		add(mfs)
	}
	return nil
}

// stageTimes is what each stage took between two readings, in the order a delivery runs them.
func stageTimes(before, after map[string]stageTotal) []stageTime {
	var out []stageTime
	for _, st := range []string{executor.StagePickup, executor.StageLoad, executor.StageBreaker, executor.StageAdmit, executor.StageBegin,
		executor.StageCall, executor.StageBookkeeping, executor.StageRecord} {
		n := after[st].count - before[st].count
		if n == 0 {
			continue
		}
		out = append(out, stageTime{stage: st, count: n, meanMS: (after[st].sum - before[st].sum) * 1000 / float64(n)})
	}
	return out
}

// stagesLine renders stages over n measured jobs ("" when there are none): the mean of each
// stage per delivery, and their sum per job.
func stagesLine(stages []stageTime, n int) string {
	if len(stages) == 0 || n == 0 {
		return ""
	}
	parts := make([]string, 0, len(stages))
	var sum float64
	for _, st := range stages {
		parts = append(parts, fmt.Sprintf("%s %.2f", st.stage, st.meanMS))
		sum += st.meanMS * float64(st.count) / float64(n)
	}
	return fmt.Sprintf("stage mean ms per delivery: %s (%.1f ms per job in all)", strings.Join(parts, ", "), sum)
}
