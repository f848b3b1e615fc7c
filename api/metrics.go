package api

import (
	"fmt"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics holds the Prometheus collectors the Handler updates. A nil
// *Metrics records nothing.
type Metrics struct {
	requests    *prometheus.CounterVec
	duration    *prometheus.HistogramVec
	idempotency *prometheus.CounterVec
}

// NewMetrics creates the API's collectors, labelled by route pattern, and
// registers them with reg. It returns an error if any is already registered.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "keyed_api_requests_total",
			Help: "HTTP API requests, by route pattern and status code.",
		}, []string{"route", "status"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "keyed_api_request_duration_seconds",
			Help:    "HTTP API request latency, by route pattern.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16),
		}, []string{"route"}),
		idempotency: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "keyed_api_idempotency_total",
			Help: "Idempotency-Key outcomes: new, takeover, replayed, in_progress, key_reused.",
		}, []string{"outcome"}),
	}
	for _, c := range []prometheus.Collector{m.requests, m.duration, m.idempotency} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register API metrics: %w", err)
		}
	}
	return m, nil
}

func (m *Metrics) request(route string, status int, d time.Duration) {
	if m == nil {
		return
	}
	m.requests.WithLabelValues(route, strconv.Itoa(status)).Inc()
	m.duration.WithLabelValues(route).Observe(d.Seconds())
}

func (m *Metrics) idem(outcome string) {
	if m != nil {
		m.idempotency.WithLabelValues(outcome).Inc()
	}
}
