package fxapp

import (
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
)

func TestSDKMetricsOnPrometheus(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	h, err := newSDKMetrics(reg)
	require.NoError(t, err)

	tq := h.WithTags(map[string]string{"namespace": "default", "task_queue": "q"})
	tq.Counter("temporal_request").Inc(2)
	tq.WithTags(map[string]string{"task_queue": "q"}).Counter("temporal_request").Inc(1) // same label set
	tq.Gauge("temporal_worker_task_slots_available").Update(7)
	tq.Timer("temporal_activity_execution_latency").Record(1500 * time.Millisecond)
	// Another label set for a known name is dropped, not a broken /metrics.
	h.WithTags(map[string]string{"namespace": "default"}).Counter("temporal_request").Inc(5)
	h.WithTags(map[string]string{"namespace": "default", "task_queue": "q"}).Timer("temporal_request").Record(time.Second)

	require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP temporal_request_total Temporal SDK metric temporal_request_total.
# TYPE temporal_request_total counter
temporal_request_total{namespace="default",task_queue="q"} 3
# HELP temporal_worker_task_slots_available Temporal SDK metric temporal_worker_task_slots_available.
# TYPE temporal_worker_task_slots_available gauge
temporal_worker_task_slots_available{namespace="default",task_queue="q"} 7
# HELP keyed_sdk_metrics_dropped_total Temporal SDK metric samples dropped because their labels did not match the metric's first label set.
# TYPE keyed_sdk_metrics_dropped_total counter
keyed_sdk_metrics_dropped_total 1
`), "temporal_request_total", "temporal_worker_task_slots_available", "keyed_sdk_metrics_dropped_total"))
	n, err := testutil.GatherAndCount(reg, "temporal_activity_execution_latency_seconds", "temporal_request_seconds")
	require.NoError(t, err)
	require.Equal(t, 2, n)
	require.Equal(t, "a_b_c", sanitizeName("a-b.c"))
}

// WithTags remembers what it made per parent and tags: the same tags give
// the same series whatever the order or path they came by, and other
// values or another parent give their own.
func TestSDKMetricsWithTagsKeepsSeriesApart(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	h, err := newSDKMetrics(reg)
	require.NoError(t, err)
	a1 := map[string]string{"a": "1"}
	for range 2 { // the second round takes the remembered sets
		h.WithTags(a1).WithTags(map[string]string{"b": "2"}).Counter("x").Inc(1)
		h.WithTags(map[string]string{"b": "2"}).WithTags(a1).Counter("x").Inc(1)
		h.WithTags(map[string]string{"a": "1", "b": "3"}).Counter("x").Inc(10)
		h.WithTags(map[string]string{"a": "2"}).WithTags(map[string]string{"b": "2"}).Counter("x").Inc(100)
	}
	require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP x_total Temporal SDK metric x_total.
# TYPE x_total counter
x_total{a="1",b="2"} 4
x_total{a="1",b="3"} 20
x_total{a="2",b="2"} 200
`), "x_total"))
}

// BenchmarkSDKMetrics records what the SDK records for one activity task
// (a handler with the task's tags, two timers and a counter) through the
// handler, beside the same samples straight on Prometheus vectors.
func BenchmarkSDKMetrics(b *testing.B) {
	tags := map[string]string{"namespace": "default", "task_queue": "q", "workflow_type": "OrderWorkflow", "activity_type": "Charge"}
	b.Run("handler", func(b *testing.B) {
		h, err := newSDKMetrics(prometheus.NewRegistry())
		require.NoError(b, err)
		for b.Loop() {
			t := h.WithTags(tags)
			t.Timer("temporal_activity_execution_latency").Record(time.Millisecond)
			t.Timer("temporal_activity_succeed_endtoend_latency").Record(time.Millisecond)
			t.Counter("temporal_request").Inc(1)
		}
	})
	b.Run("prometheus", func(b *testing.B) {
		names := []string{"activity_type", "namespace", "task_queue", "workflow_type"}
		h1 := prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "a", Buckets: sdkLatencyBuckets}, names)
		h2 := prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "b", Buckets: sdkLatencyBuckets}, names)
		c := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "c"}, names)
		for b.Loop() {
			h1.With(tags).Observe(0.001)
			h2.With(tags).Observe(0.001)
			c.With(tags).Add(1)
		}
	})
}
