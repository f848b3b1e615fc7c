package doctor

import (
	"fmt"
	"os"
	"strings"

	"sigs.k8s.io/yaml"

	"github.com/keyedhq/keyed/pipeline"
)

// deadLetterMetrics are the metrics an alert must watch for dead letters:
// runs that began waiting for a decision, and runs that failed waiting.
var deadLetterMetrics = []string{pipeline.MetricAttentionWaits + "_total", pipeline.MetricDecisionTimeouts + "_total"}

type ruleGroups struct {
	Groups []struct {
		Rules []struct {
			Alert string `json:"alert"`
			Expr  string `json:"expr"`
		} `json:"rules"`
	} `json:"groups"`
	// Spec holds the groups of a PrometheusRule manifest.
	Spec *ruleGroups `json:"spec"`
}

// deadAlerts checks that the deployed rules file alerts on every dead
// letter metric.
func (r *run) deadAlerts() Check {
	const subject = "alerts"
	if r.o.RulesFile == "" {
		return Check{Name: CheckDeadLetters, Subject: subject, Status: StatusWarn,
			Evidence: "no rules file given, so the alerts on dead letters were not checked",
			Fix:      "pass --rules with the deployed Prometheus rules file (deploy/prometheus/keyed.rules.yml or the PrometheusRule manifest)"}
	}
	raw, err := os.ReadFile(r.o.RulesFile)
	if err != nil {
		return errorCheck(CheckDeadLetters, subject, err, "")
	}
	var g ruleGroups
	if err := yaml.Unmarshal(raw, &g); err != nil {
		return errorCheck(CheckDeadLetters, subject, fmt.Errorf("parse %s: %w", r.o.RulesFile, err), "")
	}
	if g.Spec != nil {
		g.Groups = g.Spec.Groups
	}
	var found, missing []string
	for _, m := range deadLetterMetrics {
		alert := ""
		for _, grp := range g.Groups {
			for _, rule := range grp.Rules {
				if alert == "" && rule.Alert != "" && strings.Contains(rule.Expr, m) {
					alert = rule.Alert
				}
			}
		}
		if alert == "" {
			missing = append(missing, m)
		} else {
			found = append(found, alert+" ("+m+")")
		}
	}
	if len(missing) > 0 {
		return Check{Name: CheckDeadLetters, Subject: subject, Status: StatusFail,
			Evidence: fmt.Sprintf("%s has no alert on %s: dead letters would wait unseen", r.o.RulesFile, strings.Join(missing, " or ")),
			Fix:      "add KeyedRunsAwaitingDecision and KeyedDecisionTimeouts from deploy/prometheus/keyed.rules.yml"}
	}
	return Check{Name: CheckDeadLetters, Subject: subject, Status: StatusPass,
		Evidence: fmt.Sprintf("%s alerts on dead letters: %s", r.o.RulesFile, strings.Join(found, ", "))}
}
