package outbox

import (
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics holds the Prometheus collectors a Relay updates. A nil *Metrics
// records nothing. One *Metrics may be shared by several relays in a
// process.
type Metrics struct {
	depth      prometheus.Gauge
	oldestAge  prometheus.Gauge
	starts     *prometheus.CounterVec
	failures   prometheus.Counter
	startDelay prometheus.Histogram
}

// NewMetrics creates the outbox collectors and registers them with reg. It
// returns an error if any is already registered there.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		depth: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "keyed_outbox_depth",
			Help: "Outbox rows not yet sent to Temporal, due or backing off.",
		}),
		oldestAge: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "keyed_outbox_oldest_unsent_age_seconds",
			Help: "Age of the oldest outbox row not yet sent to Temporal; 0 when the outbox is drained.",
		}),
		starts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "keyed_outbox_starts_total",
			Help: "Outbox rows sent, by result: started (a new run) or collapsed (the workflow ID already had one).",
		}, []string{"result"}),
		failures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "keyed_outbox_start_failures_total",
			Help: "Workflow starts that failed and were scheduled for a retry with backoff.",
		}),
		startDelay: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "keyed_outbox_enqueue_to_start_seconds",
			Help:    "Time from an outbox row's commit to its workflow start.",
			Buckets: prometheus.ExponentialBuckets(0.005, 2, 16),
		}),
	}
	for _, c := range []prometheus.Collector{m.depth, m.oldestAge, m.starts, m.failures, m.startDelay} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register outbox metrics: %w", err)
		}
	}
	return m, nil
}

func (m *Metrics) stats(s Stats) {
	if m == nil {
		return
	}
	m.depth.Set(float64(s.Depth))
	m.oldestAge.Set(s.OldestAge.Seconds())
}

func (m *Metrics) started(created bool, delay time.Duration) {
	if m == nil {
		return
	}
	result := "collapsed"
	if created {
		result = "started"
	}
	m.starts.WithLabelValues(result).Inc()
	m.startDelay.Observe(delay.Seconds())
}

func (m *Metrics) failed() {
	if m != nil {
		m.failures.Inc()
	}
}
