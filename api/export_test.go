package api

import (
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
)

// IdemForTest exposes one idempotency outcome counter for testutil.ToFloat64.
func (m *Metrics) IdemForTest(outcome string) prometheus.Collector {
	return m.idempotency.WithLabelValues(outcome)
}

// HandleForTest adds a route to the handler's mux.
func (h *Handler) HandleForTest(pattern string, f http.HandlerFunc) {
	h.mux.HandleFunc(pattern, f)
}

// RequestKeyForTest exposes the effect key of an Idempotency-Key.
var RequestKeyForTest = requestKey
