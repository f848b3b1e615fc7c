package fakesendgrid

import "github.com/keyedhq/keyed/internal/fakefault"

// FaultKind selects what an injected Fault does to a request.
type FaultKind = fakefault.FaultKind

// Fault describes a failure applied to the next Times matching mail send
// requests. Its Match is compared with the request's JSON body; see Inject.
type Fault = fakefault.Fault

// Fault kinds understood by Inject and by POST /_fake/faults. The fake does
// not implement fakefault.FaultHoldResponse: POST /_fake/faults refuses it.
const (
	// FaultDropResponse accepts and records the message and then closes the
	// connection without writing a response.
	FaultDropResponse = fakefault.FaultDropResponse
	// FaultServerError answers 500 without accepting the message.
	FaultServerError = fakefault.FaultServerError
	// FaultRateLimit answers 429 without accepting the message.
	FaultRateLimit = fakefault.FaultRateLimit
	// FaultLatency sleeps for Delay before handling the request.
	FaultLatency = fakefault.FaultLatency
)

// faultKinds lists the fault kinds this fake implements; POST /_fake/faults
// refuses any other.
var faultKinds = []FaultKind{FaultDropResponse, FaultServerError, FaultRateLimit, FaultLatency}

// Inject queues f for the next f.Times matching mail send requests; 0 means
// 1. If f.Match is set, only requests whose (decompressed) JSON body
// contains it match, for example an effect_key custom arg value. Faults are
// consumed in the order they were injected; one request takes at most one.
// For every kind, f.Delay is slept before the request is handled.
func (s *Server) Inject(f Fault) {
	s.faults.Inject(f)
}
