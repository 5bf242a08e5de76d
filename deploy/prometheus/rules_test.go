// Package prometheus_test checks the shipped alerting rules with promtool (scripts/promtool.sh
// puts it in bin/; `make test` runs the script).
package prometheus_test

import (
	"errors"
	"os"
	"os/exec"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"gopkg.in/yaml.v3"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// promtool returns the promtool on PATH, else the one scripts/promtool.sh put in bin/. A missing
// promtool fails the test: it must not pass by skipping.
func promtool(t *testing.T) string {
	t.Helper()
	if p, err := exec.LookPath("promtool"); err == nil {
		return p
	}
	const local = "../../bin/promtool"
	if _, err := os.Stat(local); errors.Is(err, os.ErrNotExist) {
		t.Fatal("promtool not found: run scripts/promtool.sh (make test does)")
	}
	return local
}

func run(t *testing.T, args ...string) {
	t.Helper()
	out, err := exec.Command(promtool(t), args...).CombinedOutput()
	require.NoError(t, err, "promtool %v:\n%s", args, out)
}

func TestAlertRules(t *testing.T) {
	t.Parallel()
	run(t, "check", "rules", "llmq-alerts.yml")
	run(t, "test", "rules", "llmq-alerts.test.yml")
}

// TestAlertRules_EachHasATest: a rule added without a case in llmq-alerts.test.yml fails.
func TestAlertRules_EachHasATest(t *testing.T) {
	t.Parallel()
	var rules struct {
		Groups []struct {
			Rules []struct{ Alert string }
		}
	}
	var tests struct {
		Tests []struct {
			AlertRuleTest []struct{ Alertname string } `yaml:"alert_rule_test"`
		}
	}
	read := func(path string, v any) {
		b, err := os.ReadFile(path)
		require.NoError(t, err)
		require.NoError(t, yaml.Unmarshal(b, v), path)
	}
	read("llmq-alerts.yml", &rules)
	read("llmq-alerts.test.yml", &tests)
	var tested []string
	for _, tc := range tests.Tests {
		for _, a := range tc.AlertRuleTest {
			tested = append(tested, a.Alertname)
		}
	}
	n := 0
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			if r.Alert != "" {
				n++
				require.True(t, slices.Contains(tested, r.Alert), "rule %s has no case in llmq-alerts.test.yml", r.Alert)
			}
		}
	}
	require.Positive(t, n)
}
