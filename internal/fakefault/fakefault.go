// Package fakefault holds the fault injection shared by the in-process fakes
// of third-party APIs (internal/fakestripe and internal/fakesendgrid): the
// Fault type and its JSON form, a concurrency-safe queue of pending faults,
// and the admin routes through which tests and demos drive a fake over HTTP.
//
// Each fake decides what a fault does to one of its requests and which
// string a fault's Match is compared with; the fakes document both on their
// Inject methods and fault kind constants.
//
// A fault is either counted (it applies to the next Times matching requests)
// or a rate fault (Rate set: it stays queued and applies to each matching
// request with probability Rate), so that a test can say once "drop 10% of
// responses after acting, answer 5% with 500 and 5% with 429" beside the
// counted faults it queues for particular requests:
//
//	s.Inject(fakefault.Fault{Kind: fakefault.FaultDropResponse, Rate: 0.10})
//	s.Inject(fakefault.Fault{Kind: fakefault.FaultServerError, Rate: 0.05})
//	s.Inject(fakefault.Fault{Kind: fakefault.FaultRateLimit, Rate: 0.05})
package fakefault

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"
)

// FaultKind selects what an injected Fault does to a request.
type FaultKind string

// Fault kinds. Every fake honours FaultDropResponse, FaultServerError,
// FaultRateLimit and FaultLatency; FaultHoldResponse and FaultRefuseRefund
// are honoured by fakestripe only, and fakesendgrid refuses them on POST
// /_fake/faults.
const (
	// FaultDropResponse performs the request and then closes the connection
	// without writing a response, so the effect has happened but the caller
	// sees a network error. Honoured by fakestripe and fakesendgrid.
	FaultDropResponse FaultKind = "drop_response"
	// FaultServerError answers 500 without performing the request.
	// Honoured by fakestripe and fakesendgrid.
	FaultServerError FaultKind = "server_error"
	// FaultRateLimit answers 429 without performing the request. Honoured by
	// fakestripe and fakesendgrid.
	FaultRateLimit FaultKind = "rate_limit"
	// FaultLatency only sleeps for Delay while the request is in flight.
	// Honoured by fakestripe and fakesendgrid.
	FaultLatency FaultKind = "latency"
	// FaultHoldResponse performs the request and only then sleeps for Delay
	// before answering, so the effect has happened but the caller has not
	// heard. Honoured by fakestripe only.
	FaultHoldResponse FaultKind = "hold_response"
	// FaultRefuseRefund refuses a refund for good without performing it, as
	// Stripe refuses one of a disputed charge. Honoured by fakestripe only.
	FaultRefuseRefund FaultKind = "refuse_refund"
)

// kinds lists every FaultKind known to this package.
var kinds = []FaultKind{FaultDropResponse, FaultServerError, FaultRateLimit, FaultLatency, FaultHoldResponse, FaultRefuseRefund}

// Fault describes a failure applied to the next Times matching requests, or,
// when Rate is set, to each matching request with probability Rate.
type Fault struct {
	Kind FaultKind `json:"kind"`
	// Times is how many requests the fault applies to; 0 means 1 for a
	// counted fault and no limit for a rate fault.
	Times int `json:"times,omitempty"`
	// Rate, if above 0, makes this a rate fault: it stays queued and
	// applies to each matching request with probability Rate (at most 1),
	// until it has applied Times times if Times is set. The rates of the
	// rate faults matching one request add up: 0.1 and 0.05 fault 15% of
	// requests, never one request twice.
	Rate float64 `json:"rate,omitempty"`
	// Delay is slept while the request is in flight. It applies to every
	// kind, not only FaultLatency.
	// In JSON it is a Go duration string ("250ms") or nanoseconds.
	Delay time.Duration `json:"delay,omitempty"`
	// Match, if set, restricts the fault to requests whose subject contains
	// it. Each fake documents what the subject of its requests is.
	Match string `json:"match,omitempty"`
}

// UnmarshalJSON decodes a Fault, accepting Delay as a duration string or as
// nanoseconds. It refuses kinds unknown to this package, a negative Times
// and a Rate outside [0, 1]; whether a fake implements a kind is checked by
// Supported.
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
		return fmt.Errorf("fakefault: bad delay %v", d)
	}
	if !slices.Contains(kinds, f.Kind) {
		return fmt.Errorf("fakefault: unknown fault kind %q", f.Kind)
	}
	return f.check()
}

// check returns an error for a negative Times or a Rate outside [0, 1].
func (f Fault) check() error {
	switch {
	case f.Times < 0:
		return fmt.Errorf("fakefault: negative times %d", f.Times)
	case !(f.Rate >= 0 && f.Rate <= 1): // also refuses NaN
		return fmt.Errorf("fakefault: rate %v is not within [0, 1]", f.Rate)
	}
	return nil
}

// Supported returns an error unless f's kind is one of supported, the kinds
// a fake implements.
func (f Fault) Supported(supported ...FaultKind) error {
	if !slices.Contains(supported, f.Kind) {
		return fmt.Errorf("fakefault: fault kind %q is not implemented by this fake", f.Kind)
	}
	return nil
}

// Queue is a queue of pending faults. The zero value is an empty queue, and
// a Queue is safe for concurrent use. A Queue must not be copied after first
// use.
type Queue struct {
	mu     sync.Mutex
	faults []Fault
	// rand draws the roll of the rate faults; nil means rand.Float64.
	rand func() float64
}

// Inject queues f. A counted fault (Rate 0) applies to the next f.Times
// requests it matches, treating a Times of 0 as 1; a rate fault stays queued
// (see Fault.Rate). Faults are taken in the order they were injected.
// Inject panics if f.Times is negative or f.Rate is not within [0, 1], as
// POST /_fake/faults refuses such a fault before it gets here.
func (q *Queue) Inject(f Fault) {
	if err := f.check(); err != nil {
		panic(err)
	}
	if f.Rate == 0 {
		f.Times = max(f.Times, 1)
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	q.faults = append(q.faults, f)
}

// Take returns the fault that applies to one request whose subject is
// subject, consuming one application of it: the first counted fault whose
// Match is empty or a substring of subject, or else, by one random draw,
// one of the matching rate faults (each with its Rate) or none. A fault
// leaves the queue once it has been taken Times times. One request should
// call Take once, so that it takes at most one fault. Take returns the zero
// Fault and false if no fault applies.
func (q *Queue) Take(subject string) (Fault, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if i := q.pick(subject); i >= 0 {
		f := &q.faults[i]
		out := *f
		if f.Times > 0 {
			if f.Times--; f.Times == 0 {
				q.faults = append(q.faults[:i], q.faults[i+1:]...)
			}
		}
		return out, true
	}
	return Fault{}, false
}

// pick returns the index of the fault that applies to subject, or -1.
func (q *Queue) pick(subject string) int {
	matches := func(f *Fault) bool { return f.Match == "" || strings.Contains(subject, f.Match) }
	for i := range q.faults {
		if f := &q.faults[i]; f.Rate == 0 && matches(f) {
			return i
		}
	}
	roll, sum := -1.0, 0.0
	for i := range q.faults {
		f := &q.faults[i]
		if f.Rate == 0 || !matches(f) {
			continue
		}
		if roll < 0 {
			roll = q.draw()
		}
		if sum += f.Rate; roll < sum {
			return i
		}
	}
	return -1
}

func (q *Queue) draw() float64 {
	if q.rand != nil {
		return q.rand()
	}
	return rand.Float64()
}

// Pending returns a copy of the queued faults in queue order, each with the
// number of applications it has left as its Times (0 for a rate fault
// without a limit).
func (q *Queue) Pending() []Fault {
	q.mu.Lock()
	defer q.mu.Unlock()
	return append([]Fault(nil), q.faults...)
}

// Reset empties the queue.
func (q *Queue) Reset() {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.faults = nil
}

// RegisterAdmin registers a fake's admin routes on mux:
//
//   - GET /_fake/stats is served by stats, so that each fake keeps its own
//     JSON rendering of its counters;
//   - POST /_fake/faults decodes a Fault from the request body, answers 400
//     if it does not decode or its kind is not in supported, and otherwise
//     passes it to inject and answers 204;
//   - POST /_fake/reset calls reset and answers 204.
func RegisterAdmin(mux *http.ServeMux, supported []FaultKind, stats http.HandlerFunc, inject func(Fault), reset func()) {
	mux.HandleFunc("GET /_fake/stats", stats)
	mux.HandleFunc("POST /_fake/faults", func(w http.ResponseWriter, r *http.Request) {
		var f Fault
		err := json.NewDecoder(r.Body).Decode(&f)
		if err == nil {
			err = f.Supported(supported...)
		}
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		inject(f)
		w.WriteHeader(http.StatusNoContent)
	})
	mux.HandleFunc("POST /_fake/reset", func(w http.ResponseWriter, _ *http.Request) {
		reset()
		w.WriteHeader(http.StatusNoContent)
	})
}

// DropConnection closes the client connection behind w without writing a
// response, as FaultDropResponse requires. If w cannot be hijacked it
// panics with http.ErrAbortHandler, which makes the server abort the
// response instead.
func DropConnection(w http.ResponseWriter) {
	if hj, ok := w.(http.Hijacker); ok {
		if conn, _, err := hj.Hijack(); err == nil {
			conn.Close()
			return
		}
	}
	panic(http.ErrAbortHandler)
}
