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
// keyed_sdk_metrics_dropped_total rather than breaking /metrics. The
// metrics made for a tag set are kept, so a sample costs a map look-up.
func newSDKMetrics(reg prometheus.Registerer) (client.MetricsHandler, error) {
	dropped := prometheus.NewCounter(prometheus.CounterOpts{
		Name: "keyed_sdk_metrics_dropped_total",
		Help: "Temporal SDK metric samples dropped because their labels did not match the metric's first label set.",
	})
	if err := reg.Register(dropped); err != nil {
		return nil, err
	}
	r := &sdkRegistry{reg: reg, dropped: dropped, vecs: map[string]*sdkVec{}}
	return sdkHandler{r: r, t: r.tagSet(map[string]string{})}, nil
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
	// sets holds one *sdkTagSet per distinct tag set (by tagSignature),
	// so that the metrics made for a tag set outlive the handler the SDK
	// made for one task.
	sets sync.Map
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
		return nil
	}
	return v
}

// tagSet returns the registry's one *sdkTagSet for tags.
func (r *sdkRegistry) tagSet(tags map[string]string) *sdkTagSet {
	sig := string(tagSignature(nil, tags))
	if set, ok := r.sets.Load(sig); ok {
		return set.(*sdkTagSet)
	}
	set, _ := r.sets.LoadOrStore(sig, &sdkTagSet{names: slices.Sorted(maps.Keys(tags)), tags: tags})
	return set.(*sdkTagSet)
}

// sdkTagSet is one set of tags: its label names in order, its labels, the
// metrics made for it so far, by kind and name, and the sets WithTags made
// from it, by the signature of the tags it was given.
type sdkTagSet struct {
	names []string
	tags  map[string]string
	made  sync.Map // sdkMetricKey → counterFunc, gaugeFunc or timerFunc

	mu       sync.RWMutex
	children map[string]*sdkTagSet
}

// child returns the set WithTags made from t for tags of signature sig, or
// nil. The look-up does not copy sig.
func (t *sdkTagSet) child(sig []byte) *sdkTagSet {
	t.mu.RLock()
	defer t.mu.RUnlock()
	return t.children[string(sig)]
}

func (t *sdkTagSet) remember(sig []byte, c *sdkTagSet) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.children == nil {
		t.children = map[string]*sdkTagSet{}
	}
	t.children[string(sig)] = c
}

// tagSignature appends tags to dst as name, value pairs in name order, each
// ended by a zero byte. A handful of tags, as the SDK passes, are sorted
// without allocating.
func tagSignature(dst []byte, tags map[string]string) []byte {
	var small [8]string
	names := small[:0]
	for n := range tags {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, n := range names {
		dst = append(append(dst, n...), 0)
		dst = append(append(dst, tags[n]...), 0)
	}
	return dst
}

type sdkMetricKey struct {
	kind sdkKind
	name string
}

type sdkHandler struct {
	r *sdkRegistry
	t *sdkTagSet
}

// WithTags returns a handler whose metrics carry tags on top of h's. The
// SDK calls it for every task; after the first call with the same tags it
// costs a look-up.
func (h sdkHandler) WithTags(tags map[string]string) client.MetricsHandler {
	var buf [256]byte
	sig := tagSignature(buf[:0], tags)
	if c := h.t.child(sig); c != nil {
		return sdkHandler{r: h.r, t: c}
	}
	merged := make(map[string]string, len(h.t.tags)+len(tags))
	maps.Copy(merged, h.t.tags)
	for k, v := range tags {
		merged[sanitizeName(k)] = v
	}
	c := h.r.tagSet(merged)
	h.t.remember(sig, c)
	return sdkHandler{r: h.r, t: c}
}

// metric returns what h's tag set made for kind and name (a counterFunc,
// gaugeFunc or timerFunc), making it on first use; a sample that must be
// dropped is counted instead.
func (h sdkHandler) metric(kind sdkKind, name string) any {
	key := sdkMetricKey{kind, name}
	if m, ok := h.t.made.Load(key); ok {
		return m
	}
	m, _ := h.t.made.LoadOrStore(key, h.make(kind, name))
	return m
}

// make builds the metric of kind and name for h's tag set.
func (h sdkHandler) make(kind sdkKind, name string) any {
	v := h.r.vec(sanitizeName(name)+kind.suffix(), kind, h.t.names)
	dropped := h.r.dropped
	switch {
	case kind == sdkCounter && v != nil:
		c := v.counter.With(h.t.tags)
		return counterFunc(func(d int64) { c.Add(float64(d)) })
	case kind == sdkCounter:
		return counterFunc(func(int64) { dropped.Inc() })
	case kind == sdkGauge && v != nil:
		return gaugeFunc(v.gauge.With(h.t.tags).Set)
	case kind == sdkGauge:
		return gaugeFunc(func(float64) { dropped.Inc() })
	case v != nil:
		o := v.hist.With(h.t.tags)
		return timerFunc(func(d time.Duration) { o.Observe(d.Seconds()) })
	default:
		return timerFunc(func(time.Duration) { dropped.Inc() })
	}
}

// suffix is what the metric name of kind ends with.
func (k sdkKind) suffix() string {
	switch k {
	case sdkCounter:
		return "_total"
	case sdkTimer:
		return "_seconds"
	}
	return ""
}

// Counter returns the counter name_total for h's tags.
func (h sdkHandler) Counter(name string) client.MetricsCounter {
	return h.metric(sdkCounter, name).(counterFunc)
}

// Gauge returns the gauge name for h's tags.
func (h sdkHandler) Gauge(name string) client.MetricsGauge {
	return h.metric(sdkGauge, name).(gaugeFunc)
}

// Timer returns the histogram name_seconds for h's tags.
func (h sdkHandler) Timer(name string) client.MetricsTimer {
	return h.metric(sdkTimer, name).(timerFunc)
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
