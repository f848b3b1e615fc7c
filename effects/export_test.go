package effects

import "github.com/prometheus/client_golang/prometheus"

// MetricsCounterForTest exposes a counter to the external tests.
func MetricsCounterForTest(m *Metrics, name string) *prometheus.CounterVec {
	switch name {
	case "suppressed":
		return m.suppressedTotal
	case "takeovers":
		return m.takeoversTotal
	case "mismatch":
		return m.mismatchTotal
	case "in_progress":
		return m.inProgressTotal
	}
	panic("unknown metric " + name)
}

// MetricsCollectorForTest exposes a histogram to the external tests.
func MetricsCollectorForTest(m *Metrics, name string) prometheus.Collector {
	switch name {
	case "duplicate_age":
		return m.duplicateAge
	}
	panic("unknown metric " + name)
}

// ListSQL is List's statement, for the tests of its plan.
const ListSQL = listSQL

// RecordColumns is the column list Get reads, for benchmarks of its statements.
const RecordColumns = recordColumns
