package effects

import (
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics holds the Prometheus collectors the Client updates. A nil *Metrics
// records nothing.
type Metrics struct {
	acquiredTotal   *prometheus.CounterVec
	suppressedTotal *prometheus.CounterVec
	inProgressTotal *prometheus.CounterVec
	takeoversTotal  *prometheus.CounterVec
	mismatchTotal   *prometheus.CounterVec
	failedTotal     *prometheus.CounterVec
	claimSeconds    *prometheus.HistogramVec
	duplicateAge    *prometheus.HistogramVec
}

// NewMetrics creates keyed's effect collectors and registers them with reg.
// It returns an error if any is already registered there.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	kind := []string{"kind"}
	m := &Metrics{
		acquiredTotal: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "keyed_effect_claims_acquired_total",
			Help: "Claims acquired, by effect kind and mode (new, retry, reentry, takeover).",
		}, []string{"kind", "mode"}),
		suppressedTotal: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "keyed_effect_duplicates_suppressed_total",
			Help: "Claims that found the effect already finished and did no work.",
		}, kind),
		inProgressTotal: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "keyed_effect_in_progress_total",
			Help: "Claims refused because another owner holds a live lease.",
		}, kind),
		takeoversTotal: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "keyed_effect_takeovers_total",
			Help: "Claims taken over from an owner whose lease expired.",
		}, kind),
		mismatchTotal: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "keyed_effect_fingerprint_mismatches_total",
			Help: "Claims refused because the key was reused with different inputs.",
		}, kind),
		failedTotal: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "keyed_effect_failures_total",
			Help: "Effects recorded as failed, by kind and state (failed_transient, failed_terminal).",
		}, []string{"kind", "state"}),
		claimSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "keyed_effect_claim_duration_seconds",
			Help:    "Time to claim an effect key, whatever the outcome.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14),
		}, kind),
		duplicateAge: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "keyed_effect_duplicate_age_seconds",
			Help: "Age of the first claim when a duplicate arrives: the retention effect records actually need.",
			// One second to 60 days.
			Buckets: prometheus.ExponentialBuckets(1, 4, 12),
		}, kind),
	}
	for _, c := range []prometheus.Collector{m.acquiredTotal, m.suppressedTotal, m.inProgressTotal,
		m.takeoversTotal, m.mismatchTotal, m.failedTotal, m.claimSeconds, m.duplicateAge} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register effect metrics: %w", err)
		}
	}
	return m, nil
}

func (m *Metrics) acquired(kind string, mode Mode, d time.Duration) {
	if m == nil {
		return
	}
	m.acquiredTotal.WithLabelValues(kind, string(mode)).Inc()
	if mode == ModeTakeover {
		m.takeoversTotal.WithLabelValues(kind).Inc()
	}
	m.claimSeconds.WithLabelValues(kind).Observe(d.Seconds())
}

func (m *Metrics) suppressed(kind string, d, age time.Duration) {
	if m == nil {
		return
	}
	m.suppressedTotal.WithLabelValues(kind).Inc()
	m.claimSeconds.WithLabelValues(kind).Observe(d.Seconds())
	m.duplicateAge.WithLabelValues(kind).Observe(age.Seconds())
}

func (m *Metrics) inProgress(kind string) {
	if m != nil {
		m.inProgressTotal.WithLabelValues(kind).Inc()
	}
}

func (m *Metrics) mismatch(kind string) {
	if m != nil {
		m.mismatchTotal.WithLabelValues(kind).Inc()
	}
}

func (m *Metrics) failed(kind string, state State) {
	if m != nil {
		m.failedTotal.WithLabelValues(kind, string(state)).Inc()
	}
}
