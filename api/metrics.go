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
	conns       prometheus.Gauge
	maxConns    prometheus.Gauge
	closedIdle  prometheus.Counter
	closedSlow  prometheus.Counter
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
		conns: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "keyed_api_connections",
			Help: "Client connections the API server holds open (at most KEYED_API_MAX_CONNECTIONS).",
		}),
		maxConns: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "keyed_api_connections_max",
			Help: "The API server's connection cap (KEYED_API_MAX_CONNECTIONS, or its default).",
		}),
		closedIdle: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "keyed_api_connections_closed_idle_total",
			Help: "Idle keep-alive connections the API server closed to make room at its connection cap.",
		}),
		closedSlow: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "keyed_api_connections_closed_slow_total",
			Help: "New connections the API server closed at its connection cap, with none idle, for not sending complete request headers within their grace (a second, or half the header timeout if shorter).",
		}),
	}
	for _, c := range []prometheus.Collector{m.requests, m.duration, m.idempotency, m.conns, m.maxConns, m.closedIdle, m.closedSlow} {
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

func (m *Metrics) connOpened(delta float64) {
	if m != nil {
		m.conns.Add(delta)
	}
}

func (m *Metrics) connCap(n int) {
	if m != nil {
		m.maxConns.Set(float64(n))
	}
}

func (m *Metrics) idleClosed() {
	if m != nil {
		m.closedIdle.Inc()
	}
}

func (m *Metrics) slowClosed() {
	if m != nil {
		m.closedSlow.Inc()
	}
}
