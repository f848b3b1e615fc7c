package api

import (
	"net/http"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/keyedhq/keyed/idempotency"
)

// IdemForTest exposes one idempotency outcome counter for testutil.ToFloat64.
func (m *Metrics) IdemForTest(outcome string) prometheus.Collector {
	return m.idempotency.WithLabelValues(outcome)
}

// HandleForTest adds a route to the handler's mux.
func (h *Handler) HandleForTest(pattern string, f http.HandlerFunc) {
	h.mux.HandleFunc(pattern, f)
}

// RoutesForTest returns the patterns of the handler's route table.
func (h *Handler) RoutesForTest() []string {
	out := make([]string, 0, len(h.routes))
	for _, rt := range h.routes {
		out = append(out, rt.pattern)
	}
	return out
}

// RequestKeyForTest exposes the effect key of an Idempotency-Key.
var RequestKeyForTest = idempotency.StoredKey

// OpenConnsForTest returns how many connections hold one of the server's
// slots.
func (s *Server) OpenConnsForTest() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ln.open()
}

// ConnMetricsForTest returns the connection gauges and the counters of
// idle and slow connections closed at the cap.
func (m *Metrics) ConnMetricsForTest() (open, max, closedIdle, closedSlow prometheus.Collector) {
	return m.conns, m.maxConns, m.closedIdle, m.closedSlow
}
