package api

import "github.com/prometheus/client_golang/prometheus"

// IdemForTest exposes one idempotency outcome counter for testutil.ToFloat64.
func (m *Metrics) IdemForTest(outcome string) prometheus.Collector {
	return m.idempotency.WithLabelValues(outcome)
}
