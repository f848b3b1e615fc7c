package api

import (
	"errors"
	"math"
	"net/http"
	"strconv"
	"sync"
	"time"
)

// RateLimit is a per-tenant token bucket on the /v1 routes (Burst requests,
// refilled at Rate a second, per API replica). An empty bucket gets 429
// rate_limited with Retry-After before anything else: nothing written, no
// Idempotency-Key claimed. The zero value turns the limit off.
type RateLimit struct {
	// Rate is how many requests a second a tenant may send, sustained.
	// Zero turns the limit off.
	Rate float64
	// Burst is how many requests a tenant may send at once after a quiet
	// spell: the bucket's size. It must be at least 1 when Rate is set.
	Burst int
}

// validate returns an error for a limit out of range.
func (l RateLimit) validate() error {
	switch {
	case l.Rate < 0 || math.IsNaN(l.Rate) || math.IsInf(l.Rate, 0):
		return errors.New("rate limit must be a finite number of requests a second, 0 for none")
	case l.Rate > 0 && l.Burst < 1:
		return errors.New("rate limit burst must be at least 1")
	}
	return nil
}

// limiter holds one token bucket per tenant. Tenants come from the API
// keys, so the buckets are bounded by the keys configured.
type limiter struct {
	RateLimit
	now func() time.Time

	mu      sync.Mutex
	buckets map[string]*bucket
}

type bucket struct {
	tokens float64
	at     time.Time
}

// newLimiter returns the limiter of l, or nil when l is off.
func newLimiter(l RateLimit) (*limiter, error) {
	if err := l.validate(); err != nil {
		return nil, err
	}
	if l.Rate == 0 {
		return nil, nil
	}
	return &limiter{RateLimit: l, now: time.Now, buckets: map[string]*bucket{}}, nil
}

// take spends one of tenant's tokens and returns 0, or, when its bucket is
// empty, spends nothing and returns how long until it holds a token. A nil
// limiter always returns 0.
func (l *limiter) take(tenant string) time.Duration {
	if l == nil {
		return 0
	}
	now := l.now()
	l.mu.Lock()
	defer l.mu.Unlock()
	b := l.buckets[tenant]
	if b == nil {
		b = &bucket{tokens: float64(l.Burst), at: now}
		l.buckets[tenant] = b
	}
	if elapsed := now.Sub(b.at); elapsed > 0 {
		b.tokens = min(float64(l.Burst), b.tokens+elapsed.Seconds()*l.Rate)
		b.at = now
	}
	if b.tokens >= 1 {
		b.tokens--
		return 0
	}
	return time.Duration(math.Ceil((1 - b.tokens) / l.Rate * float64(time.Second)))
}

// limited answers 429 rate_limited, with Retry-After in whole seconds (at
// least 1), and returns true when tenant's bucket is empty.
func (h *Handler) limited(w http.ResponseWriter, tenant string) bool {
	wait := h.limiter.take(tenant)
	if wait <= 0 {
		return false
	}
	secs := max(1, int(math.Ceil(wait.Seconds())))
	w.Header().Set("Retry-After", strconv.Itoa(secs))
	writeError(w, newError(http.StatusTooManyRequests, CodeRateLimited, "",
		"more than %s requests a second (bursts of %d) for this tenant; retry after %d s",
		strconv.FormatFloat(h.limiter.Rate, 'f', -1, 64), h.limiter.Burst, secs))
	return true
}
