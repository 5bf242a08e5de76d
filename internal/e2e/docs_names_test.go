package e2e_test

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestDocs_MetricsAndAlertsExist holds the metric and alert names of the README and of the
// documents under docs/ to the code: every metric they name in backquotes (`llmq_x`,
// `llmq_x{label}`, a histogram's `llmq_x_count`) is a string literal of llmq's code outside its
// tests, and every alert they name (LLMQSomething) is a rule of deploy/prometheus/llmq-alerts.yml.
func TestDocs_MetricsAndAlertsExist(t *testing.T) {
	t.Parallel()
	var code strings.Builder
	for _, dir := range []string{"cmd", "internal"} {
		require.NoError(t, filepath.WalkDir(filepath.Join(repoRoot, dir), func(p string, d os.DirEntry, err error) error {
			if err != nil || d.IsDir() || !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") {
				return err
			}
			b, err := os.ReadFile(p)
			code.Write(b)
			return err
		}))
	}
	rules, err := os.ReadFile(filepath.Join(repoRoot, "deploy", "prometheus", "llmq-alerts.yml"))
	require.NoError(t, err)
	alerts := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^\s*- alert: (\w+)$`).FindAllStringSubmatch(string(rules), -1) {
		alerts[m[1]] = true
	}
	require.NotEmpty(t, alerts)

	docs, err := filepath.Glob(filepath.Join(repoRoot, "docs", "*.md"))
	require.NoError(t, err)
	metric := regexp.MustCompile("`(llmq_[a-z_]+?)(?:_bucket|_count|_sum)?[`{]")
	alert := regexp.MustCompile(`\bLLMQ[A-Z]\w+`)
	for _, doc := range append([]string{filepath.Join(repoRoot, "README.md")}, docs...) {
		md, err := os.ReadFile(doc)
		require.NoError(t, err)
		name := strings.TrimPrefix(doc, repoRoot+"/")
		for _, m := range metric.FindAllStringSubmatch(string(md), -1) {
			if !strings.Contains(code.String(), `"`+m[1]+`"`) {
				t.Errorf("%s names the metric %s, which no code registers", name, m[1])
			}
		}
		for _, a := range alert.FindAllString(string(md), -1) {
			if !alerts[a] {
				t.Errorf("%s names the alert %s, which deploy/prometheus/llmq-alerts.yml does not have", name, a)
			}
		}
	}
}
