package fxapp

import (
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.temporal.io/sdk/client"
)

// sdkLatencyBuckets spans a fast poll to a slow provider call, in seconds.
var sdkLatencyBuckets = []float64{.001, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300}

// newSDKMetrics returns a client.MetricsHandler recording the Temporal SDK's
// metrics on reg: counters as <name>_total, gauges as <name>, timers as
// <name>_seconds histograms, tags as labels. A sample with a label set other
// than its name's first is dropped and counted in
// keyed_sdk_metrics_dropped_total rather than breaking /metrics.
func newSDKMetrics(reg prometheus.Registerer) (client.MetricsHandler, error) {
	dropped := prometheus.NewCounter(prometheus.CounterOpts{
		Name: "keyed_sdk_metrics_dropped_total",
		Help: "Temporal SDK metric samples dropped because their labels did not match the metric's first label set.",
	})
	if err := reg.Register(dropped); err != nil {
		return nil, err
	}
	return sdkHandler{r: &sdkRegistry{reg: reg, dropped: dropped, vecs: map[string]*sdkVec{}}}, nil
}

type sdkKind int

const (
	sdkCounter sdkKind = iota
	sdkGauge
	sdkTimer
)

type sdkVec struct {
	kind    sdkKind
	labels  []string
	counter *prometheus.CounterVec
	gauge   *prometheus.GaugeVec
	hist    *prometheus.HistogramVec
	broken  bool // registration failed: drop every sample
}

type sdkRegistry struct {
	reg     prometheus.Registerer
	dropped prometheus.Counter
	mu      sync.Mutex
	vecs    map[string]*sdkVec
}

// vec returns the vector for name with labels, creating and registering it
// on first use, or nil when the sample must be dropped.
func (r *sdkRegistry) vec(name string, kind sdkKind, labels []string) *sdkVec {
	r.mu.Lock()
	defer r.mu.Unlock()
	v, ok := r.vecs[name]
	if !ok {
		v = &sdkVec{kind: kind, labels: labels}
		help := "Temporal SDK metric " + name + "."
		var c prometheus.Collector
		switch kind {
		case sdkCounter:
			v.counter = prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, labels)
			c = v.counter
		case sdkGauge:
			v.gauge = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: name, Help: help}, labels)
			c = v.gauge
		case sdkTimer:
			v.hist = prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: name, Help: help, Buckets: sdkLatencyBuckets}, labels)
			c = v.hist
		}
		v.broken = r.reg.Register(c) != nil
		r.vecs[name] = v
	}
	if v.broken || v.kind != kind || !slices.Equal(v.labels, labels) {
		r.dropped.Inc()
		return nil
	}
	return v
}

type sdkHandler struct {
	r    *sdkRegistry
	tags map[string]string
}

// WithTags returns a handler whose metrics carry tags on top of h's.
func (h sdkHandler) WithTags(tags map[string]string) client.MetricsHandler {
	merged := make(map[string]string, len(h.tags)+len(tags))
	for k, v := range h.tags {
		merged[sanitizeName(k)] = v
	}
	for k, v := range tags {
		merged[sanitizeName(k)] = v
	}
	return sdkHandler{r: h.r, tags: merged}
}

func (h sdkHandler) labels() ([]string, prometheus.Labels) {
	return slices.Sorted(maps.Keys(h.tags)), prometheus.Labels(h.tags)
}

// Counter returns the counter name_total for h's tags.
func (h sdkHandler) Counter(name string) client.MetricsCounter {
	names, values := h.labels()
	v := h.r.vec(sanitizeName(name)+"_total", sdkCounter, names)
	if v == nil {
		return counterFunc(func(int64) {})
	}
	c := v.counter.With(values)
	return counterFunc(func(d int64) { c.Add(float64(d)) })
}

// Gauge returns the gauge name for h's tags.
func (h sdkHandler) Gauge(name string) client.MetricsGauge {
	names, values := h.labels()
	v := h.r.vec(sanitizeName(name), sdkGauge, names)
	if v == nil {
		return gaugeFunc(func(float64) {})
	}
	g := v.gauge.With(values)
	return gaugeFunc(g.Set)
}

// Timer returns the histogram name_seconds for h's tags.
func (h sdkHandler) Timer(name string) client.MetricsTimer {
	names, values := h.labels()
	v := h.r.vec(sanitizeName(name)+"_seconds", sdkTimer, names)
	if v == nil {
		return timerFunc(func(time.Duration) {})
	}
	o := v.hist.With(values)
	return timerFunc(func(d time.Duration) { o.Observe(d.Seconds()) })
}

// sanitizeName makes s a valid Prometheus metric or label name.
func sanitizeName(s string) string {
	return strings.Map(func(r rune) rune {
		if r == '_' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' {
			return r
		}
		return '_'
	}, s)
}

type counterFunc func(int64)

func (f counterFunc) Inc(d int64) { f(d) }

type gaugeFunc func(float64)

func (f gaugeFunc) Update(v float64) { f(v) }

type timerFunc func(time.Duration)

func (f timerFunc) Record(d time.Duration) { f(d) }
