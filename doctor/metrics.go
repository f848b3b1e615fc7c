package doctor

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// MetricCheckStatus is the gauge of each check's last status, by check and
// subject: 0 pass, 1 warn, 2 could not check, 3 fail.
const MetricCheckStatus = "keyed_doctor_check_status"

// Value returns s as MetricCheckStatus records it: 0 pass, 1 warn, 2 could
// not check, 3 fail.
func (s Status) Value() float64 {
	switch s {
	case StatusPass:
		return 0
	case StatusWarn:
		return 1
	case StatusError:
		return 2
	}
	return 3
}

// Metrics exports reports as the MetricCheckStatus gauge. A nil *Metrics
// records nothing.
type Metrics struct {
	status *prometheus.GaugeVec
}

// NewMetrics registers the gauge with reg. It returns an error if it is
// already registered there.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{status: prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: MetricCheckStatus,
		Help: "Status of each keyed doctor check at the worker's start, by check and subject: 0 pass, 1 warn, 2 could not check, 3 fail.",
	}, []string{"check", "subject"})}
	if err := reg.Register(m.status); err != nil {
		return nil, fmt.Errorf("register doctor metrics: %w", err)
	}
	return m, nil
}

// Observe sets the gauge of every check in rep.
func (m *Metrics) Observe(rep *Report) {
	if m == nil || rep == nil {
		return
	}
	for _, c := range rep.Checks {
		m.status.WithLabelValues(c.Name, c.Subject).Set(c.Status.Value())
	}
}
