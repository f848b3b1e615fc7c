package fakestripe

import (
	"net/http"

	"github.com/keyedhq/keyed/internal/fakefault"
)

// FaultKind selects what an injected Fault does to a request.
type FaultKind = fakefault.FaultKind

// Fault describes a failure applied to the next Times matching create
// requests (PaymentIntents and Refunds). Its Match is compared with the
// request's method, path and Idempotency-Key; see Inject.
type Fault = fakefault.Fault

// Fault kinds understood by Inject and by POST /_fake/faults. The fake
// implements all of them.
const (
	// FaultDropResponse performs the request (charges or refunds, and
	// stores its idempotent result) and then closes the connection without
	// writing a response.
	FaultDropResponse = fakefault.FaultDropResponse
	// FaultServerError answers 500 api_error without performing anything.
	FaultServerError = fakefault.FaultServerError
	// FaultRateLimit answers 429 rate_limit without performing anything.
	FaultRateLimit = fakefault.FaultRateLimit
	// FaultLatency sleeps for Delay while the request is in flight.
	FaultLatency = fakefault.FaultLatency
	// FaultHoldResponse performs the request, stores its idempotent
	// result, and only then sleeps for Delay before answering: the effect
	// has happened but the caller has not heard. Use it to kill a worker
	// between the charge and the activity's completion.
	FaultHoldResponse = fakefault.FaultHoldResponse
	// FaultRefuseRefund answers a refund request 400
	// invalid_request_error/charge_disputed without refunding, and stores
	// that answer for idempotent replays, as Stripe refuses a refund of a
	// disputed charge for good. Match it with "POST /v1/refunds": it does
	// nothing to a charge.
	FaultRefuseRefund = fakefault.FaultRefuseRefund
)

// faultKinds lists the fault kinds this fake implements; POST /_fake/faults
// refuses any other.
var faultKinds = []FaultKind{FaultDropResponse, FaultServerError, FaultRateLimit, FaultLatency, FaultHoldResponse, FaultRefuseRefund}

// Inject queues f for the next f.Times matching create requests
// (POST /v1/payment_intents and POST /v1/refunds); 0 means 1. If f.Match is
// set, only requests whose subject "METHOD PATH IDEMPOTENCY-KEY" contains
// it match: a part of a key ("order-7") matches by key, "POST /v1/refunds"
// only refunds and "POST /v1/payment_intents" only charges. GET requests
// take no fault. Faults are consumed in the order they were injected; one
// request takes at most one. For every kind, f.Delay is slept with the
// request already in flight (after the charge or refund for
// FaultHoldResponse, before it otherwise). A fault with f.Rate set is a
// rate fault instead: it stays queued and applies to each matching request
// with probability f.Rate (see fakefault.Fault), so that
//
//	s.Inject(Fault{Kind: FaultDropResponse, Rate: 0.10})
//
// charges or refunds and then drops the response of about 10% of requests.
func (s *Server) Inject(f Fault) {
	s.faults.Inject(f)
}

// SetOutage turns an outage of the whole API on or off: while on, every
// /v1 request, reads included, is answered 503 api_error, as Stripe answers
// during an incident, and nothing is performed. Reset ends it.
func (s *Server) SetOutage(on bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.down = on
}

// outage answers r with 503 and reports true while the outage is on.
func (s *Server) outage(w http.ResponseWriter) bool {
	s.mu.Lock()
	down := s.down
	s.mu.Unlock()
	if down {
		writeError(w, http.StatusServiceUnavailable, &apiError{Type: "api_error",
			Message: "Stripe is temporarily unavailable. Please try again later."})
	}
	return down
}
