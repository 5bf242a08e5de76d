package main

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/llmq/llmq/internal/api"
	"github.com/llmq/llmq/internal/executor"
)

// stageMetric is the worker's histogram of where a delivery's time goes.
const stageMetric = "llmq_delivery_stage_duration_seconds"

// submitStageMetric is the API's histogram of where a new job's submit spends its time. Its
// stages are kept under submitPrefix + the stage (they lie within the worker's pick-up stage).
const (
	submitStageMetric = "llmq_submit_stage_duration_seconds"
	submitPrefix      = "submit "
)

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
	// submit: one of the API's submit stages (api.SubmitStageCreate, ...), not a delivery's.
	submit bool
}

// addStageTotals adds stageMetric's and submitStageMetric's series in mfs to into.
func addStageTotals(into map[string]stageTotal, mfs []*dto.MetricFamily) {
	for _, mf := range mfs {
		prefix := ""
		switch mf.GetName() {
		case stageMetric:
		case submitStageMetric:
			prefix = submitPrefix
		default:
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "stage" {
					key := prefix + l.GetValue()
					t := into[key]
					t.count += m.GetHistogram().GetSampleCount()
					t.sum += m.GetHistogram().GetSampleSum()
					into[key] = t
				}
			}
		}
	}
}

// stageAddrs is where a stack's stages are read: its workers' /metrics listeners (with
// stackConfig.metrics; serve processes' are also their APIs') and those of the APIs at apiURLs
// that are not among them.
func stageAddrs(st *stack, apiURLs []string) []string {
	addrs := slices.Clone(st.metricsAddrs)
	for _, u := range apiURLs {
		if a := strings.TrimPrefix(u, "http://"); !slices.Contains(addrs, a) {
			addrs = append(addrs, a)
		}
	}
	return addrs
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

// stageTimes is what each stage took between two readings, in the order a delivery runs them,
// then the API's submit stages in the order a submit runs them.
func stageTimes(before, after map[string]stageTotal) []stageTime {
	var out []stageTime
	add := func(key, stage string, submit bool) {
		n := after[key].count - before[key].count
		if n == 0 {
			return
		}
		out = append(out, stageTime{stage: stage, count: n, meanMS: (after[key].sum - before[key].sum) * 1000 / float64(n), submit: submit})
	}
	for _, st := range []string{executor.StagePickup, executor.StageLoad, executor.StageBreaker, executor.StageAdmit, executor.StageBegin,
		executor.StageCall, executor.StageBookkeeping, executor.StageRecord} {
		add(st, st, false)
	}
	for _, st := range []string{api.SubmitStageCreate, api.SubmitStageEnqueue} {
		add(submitPrefix+st, st, true)
	}
	return out
}

// stagesLine renders stages over n measured jobs ("" when there are none): the mean of each
// delivery stage per delivery and their sum per job, then the mean of each submit stage (part
// of the pick-up, so not added to the sum).
func stagesLine(stages []stageTime, n int) string {
	if len(stages) == 0 || n == 0 {
		return ""
	}
	var parts, submit []string
	var sum float64
	for _, st := range stages {
		if st.submit {
			submit = append(submit, fmt.Sprintf("%s %.2f", st.stage, st.meanMS))
			continue
		}
		parts = append(parts, fmt.Sprintf("%s %.2f", st.stage, st.meanMS))
		sum += st.meanMS * float64(st.count) / float64(n)
	}
	var line string
	if len(parts) > 0 {
		line = fmt.Sprintf("stage mean ms per delivery: %s (%.1f ms per job in all)", strings.Join(parts, ", "), sum)
	}
	if len(submit) > 0 {
		if line != "" {
			line += "; "
		}
		line += "of the pick-up, the API's submit stages, mean ms per job: " + strings.Join(submit, ", ")
	}
	return line
}
