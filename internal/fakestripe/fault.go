package fakestripe

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"time"
)

// FaultKind selects what an injected Fault does to a request.
type FaultKind string

// Fault kinds understood by Inject and by POST /_fake/faults.
const (
	// FaultDropResponse performs the request (and stores its idempotent
	// result) and then closes the connection without writing a response.
	FaultDropResponse FaultKind = "drop_response"
	// FaultServerError answers 500 api_error without performing anything.
	FaultServerError FaultKind = "server_error"
	// FaultRateLimit answers 429 rate_limit without performing anything.
	FaultRateLimit FaultKind = "rate_limit"
	// FaultLatency sleeps for Delay while the request is in flight.
	FaultLatency FaultKind = "latency"
	// FaultHoldResponse performs the request, stores its idempotent
	// result, and only then sleeps for Delay before answering: the effect
	// has happened but the caller has not heard. Use it to kill a worker
	// between the charge and the activity's completion.
	FaultHoldResponse FaultKind = "hold_response"
)

// Fault describes a failure applied to the next Times matching
// PaymentIntent create requests.
type Fault struct {
	Kind FaultKind `json:"kind"`
	// Times is how many requests the fault applies to; 0 means 1.
	Times int `json:"times,omitempty"`
	// Delay is slept before the request is processed, with the request
	// already in flight. It applies to every kind, not only FaultLatency.
	// In JSON it is a Go duration string ("250ms") or nanoseconds.
	Delay time.Duration `json:"delay,omitempty"`
	// Match, if set, restricts the fault to requests whose Idempotency-Key
	// contains it.
	Match string `json:"match,omitempty"`
}

// UnmarshalJSON decodes a Fault, accepting Delay as a duration string or as
// nanoseconds.
func (f *Fault) UnmarshalJSON(b []byte) error {
	type plain Fault
	aux := struct {
		*plain
		Delay any `json:"delay"`
	}{plain: (*plain)(f)}
	if err := json.Unmarshal(b, &aux); err != nil {
		return err
	}
	switch d := aux.Delay.(type) {
	case nil:
	case float64:
		f.Delay = time.Duration(d)
	case string:
		v, err := time.ParseDuration(d)
		if err != nil {
			return err
		}
		f.Delay = v
	default:
		return fmt.Errorf("fakestripe: bad delay %v", d)
	}
	switch f.Kind {
	case FaultDropResponse, FaultServerError, FaultRateLimit, FaultLatency, FaultHoldResponse:
		return nil
	}
	return fmt.Errorf("fakestripe: unknown fault kind %q", f.Kind)
}

// Inject queues f for the next f.Times matching create requests. Faults are
// consumed in the order they were injected; one request takes at most one.
func (s *Server) Inject(f Fault) {
	f.Times = max(f.Times, 1)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.faults = append(s.faults, f)
}

// takeFault consumes and returns the first queued fault matching idemKey.
func (s *Server) takeFault(idemKey string) (Fault, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i := range s.faults {
		f := &s.faults[i]
		if f.Match != "" && !strings.Contains(idemKey, f.Match) {
			continue
		}
		out := *f
		if f.Times--; f.Times == 0 {
			s.faults = append(s.faults[:i], s.faults[i+1:]...)
		}
		return out, true
	}
	return Fault{}, false
}

// dropConnection closes the client connection without writing a response.
func dropConnection(w http.ResponseWriter) {
	if hj, ok := w.(http.Hijacker); ok {
		if conn, _, err := hj.Hijack(); err == nil {
			conn.Close()
			return
		}
	}
	panic(http.ErrAbortHandler)
}
