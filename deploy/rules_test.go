package deploy

import (
	"flag"
	"os"
	"os/exec"
	"testing"

	"github.com/stretchr/testify/require"
	"sigs.k8s.io/yaml"
)

var update = flag.Bool("update", false, "rewrite k8s/base/prometheusrule.yaml from prometheus/keyed.rules.yml")

const (
	rulesFile     = "prometheus/keyed.rules.yml"
	rulesTestFile = "prometheus/keyed.rules.test.yml"
	ruleManifest  = "k8s/base/prometheusrule.yaml"
)

// findPromtool returns $KEYED_PROMTOOL_BIN, bin/promtool (make tools puts
// it there) or the promtool on PATH.
func findPromtool(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("KEYED_PROMTOOL_BIN"); p != "" {
		return p
	}
	if _, err := os.Stat("../bin/promtool"); err == nil {
		return "../bin/promtool"
	}
	p, err := exec.LookPath("promtool")
	require.NoError(t, err, "no promtool in bin/ or on PATH: run `make tools` (it extracts promtool from Debian's prometheus package) or set KEYED_PROMTOOL_BIN")
	return p
}

func readRules(t *testing.T) ruleGroups {
	t.Helper()
	raw, err := os.ReadFile(rulesFile)
	require.NoError(t, err)
	var g ruleGroups
	require.NoError(t, yaml.UnmarshalStrict(raw, &g))
	require.NotEmpty(t, g.Groups)
	return g
}

// TestPrometheusRuleMatchesRulesFile checks that the PrometheusRule the
// kustomization deploys carries exactly the groups of the rules file
// promtool tests. Run with -update to regenerate it.
func TestPrometheusRuleMatchesRulesFile(t *testing.T) {
	t.Parallel()
	want := prometheusRule{APIVersion: "monitoring.coreos.com/v1", Kind: "PrometheusRule",
		Metadata: objectMeta{Name: "keyed", Labels: map[string]string{"app.kubernetes.io/name": "keyed"}}, Spec: readRules(t)}
	if *update {
		out, err := yaml.Marshal(want)
		require.NoError(t, err)
		header := "# Generated from deploy/prometheus/keyed.rules.yml by\n" +
			"# `go test ./deploy/ -run PrometheusRule -update`: edit that file, not this one.\n"
		require.NoError(t, os.WriteFile(ruleManifest, append([]byte(header), out...), 0o644))
	}
	raw, err := os.ReadFile(ruleManifest)
	require.NoError(t, err)
	var got prometheusRule
	require.NoError(t, yaml.UnmarshalStrict(raw, &got))
	require.Equal(t, want, got, "%s is stale: run go test ./deploy/ -run PrometheusRule -update", ruleManifest)
}

// TestPromtoolRules runs promtool's checks and the rules' unit tests.
func TestPromtoolRules(t *testing.T) {
	t.Parallel()
	promtool := findPromtool(t)
	out, err := exec.Command(promtool, "check", "rules", rulesFile).CombinedOutput()
	require.NoError(t, err, "promtool check rules:\n%s", out)
	out, err = exec.Command(promtool, "test", "rules", rulesTestFile).CombinedOutput()
	require.NoError(t, err, "promtool test rules:\n%s", out)

	// Every alert has a unit test that expects it to fire.
	raw, err := os.ReadFile(rulesTestFile)
	require.NoError(t, err)
	var tests struct {
		Tests []struct {
			AlertRuleTest []struct {
				Alertname string           `json:"alertname"`
				ExpAlerts []map[string]any `json:"exp_alerts"`
			} `json:"alert_rule_test"`
		} `json:"tests"`
	}
	require.NoError(t, yaml.Unmarshal(raw, &tests))
	fired := map[string]bool{}
	for _, tc := range tests.Tests {
		for _, a := range tc.AlertRuleTest {
			fired[a.Alertname] = fired[a.Alertname] || len(a.ExpAlerts) > 0
		}
	}
	for _, g := range readRules(t).Groups {
		for _, r := range g.Rules {
			require.True(t, fired[r.Alert], "alert %s has no unit test in which it fires", r.Alert)
		}
	}
}
