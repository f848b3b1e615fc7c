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

// Inject queues f for the next f.Times (0 means 1) matching create requests,
// POST /v1/payment_intents and POST /v1/refunds; with f.Match, only those
// whose "METHOD PATH IDEMPOTENCY-KEY" contains it. GET requests take no fault;
// faults apply in injection order, one per request. f.Delay is slept with the
// request in flight (after acting for FaultHoldResponse, before otherwise).
// With f.Rate set the fault stays queued and applies to each matching request
// with that probability (fakefault.Fault).
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
