package api

import "time"

// SetRateLimitClockForTest makes the handler's rate limiter read the time
// from now. Call it before serving.
func (h *Handler) SetRateLimitClockForTest(now func() time.Time) {
	if h.limiter != nil {
		h.limiter.now = now
	}
}
