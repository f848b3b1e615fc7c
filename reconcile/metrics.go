package reconcile

import (
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics holds the reconciler's collectors. A nil *metrics records nothing.
type metrics struct {
	findings    *prometheus.GaugeVec
	total       *prometheus.CounterVec
	lastSuccess prometheus.Gauge
}

// newMetrics creates the collectors, registers them with reg and sets every
// kind to zero, so that an alert on a kind sees a series before its first
// finding. It returns an error if any is already registered there.
func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		findings: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "keyed_reconcile_findings",
			Help: "Findings of the last reconciliation run against Stripe, by kind (extra_charges, missing_record, mismatch, missing_at_provider, double_refund, released_but_refunded, unrecorded_refund, refund_mismatch, refund_missing_at_provider, duplicate_emails, unrecorded_email, email_missing_at_provider).",
		}, []string{"kind"}),
		total: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "keyed_reconcile_findings_total",
			Help: "Findings of every reconciliation run against Stripe, by kind; overlapping windows count a finding again.",
		}, []string{"kind"}),
		lastSuccess: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "keyed_reconcile_last_success_timestamp_seconds",
			Help: "Unix time at which the last reconciliation run completed.",
		}),
	}
	for _, c := range []prometheus.Collector{m.findings, m.total, m.lastSuccess} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register reconcile metrics: %w", err)
		}
	}
	for _, k := range Kinds {
		m.findings.WithLabelValues(string(k))
		m.total.WithLabelValues(string(k))
	}
	return m, nil
}

func (m *metrics) observe(rep *Report) {
	if m == nil {
		return
	}
	for k, n := range rep.Counts() {
		m.findings.WithLabelValues(string(k)).Set(float64(n))
		m.total.WithLabelValues(string(k)).Add(float64(n))
	}
	m.lastSuccess.Set(float64(time.Now().UnixNano()) / 1e9)
}
