package fakestripe

import (
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/keyedhq/keyed/internal/fakefault"
)

// idemScope identifies an idempotency key; keys are scoped per API key.
type idemScope struct{ apiKey, key string }

// idemEntry is a stored (or in-flight, while !done) idempotent request.
type idemEntry struct {
	fingerprint string
	done        bool
	status      int
	body        []byte
	requestID   string
	created     time.Time
}

// executor performs the work of one create request on its form params p.
// It returns the created object or the error to answer with (an error's
// body wins when both are set, as for a decline), the HTTP status, and
// whether the result is stored for idempotent replays.
type executor func(p url.Values, idemKey string) (obj any, status int, apiErr *apiError, store bool)

// post returns the handler of a create request performed by exec, with
// Stripe's Idempotency-Key semantics and the injected faults: a fault's
// Match is compared with "METHOD PATH KEY", e.g.
// "POST /v1/refunds order-1:refund".
func (s *Server) post(exec executor) func(http.ResponseWriter, *http.Request, string) {
	return func(w http.ResponseWriter, r *http.Request, apiKey string) {
		s.serveCreate(w, r, apiKey, exec)
	}
}

// serveCreate serves one create request for post.
func (s *Server) serveCreate(w http.ResponseWriter, r *http.Request, apiKey string, exec executor) {
	if err := r.ParseForm(); err != nil {
		writeError(w, http.StatusBadRequest, &apiError{Type: "invalid_request_error", Message: "Invalid request body: " + err.Error()})
		return
	}
	key := strings.TrimSpace(r.Header.Get("Idempotency-Key"))
	if len(key) > 255 {
		writeError(w, http.StatusBadRequest, &apiError{Type: "invalid_request_error",
			Message: "Idempotency-Key must be at most 255 characters long."})
		return
	}
	fault, _ := s.faults.Take(r.Method + " " + r.URL.Path + " " + key)
	if fault.Kind == FaultRefuseRefund && r.URL.Path == "/v1/refunds" {
		exec = refuseRefund
	}
	switch fault.Kind {
	case FaultServerError:
		time.Sleep(fault.Delay)
		writeError(w, http.StatusInternalServerError, &apiError{Type: "api_error",
			Message: "An unknown error occurred. Please try again later."})
		return
	case FaultRateLimit:
		time.Sleep(fault.Delay)
		writeError(w, http.StatusTooManyRequests, &apiError{Type: "invalid_request_error", Code: "rate_limit",
			Message: "Request rate limit exceeded. You can learn more about rate limits here https://stripe.com/docs/rate-limits."})
		return
	}
	if key != "" {
		w.Header().Set("Idempotency-Key", key)
	}
	scope := idemScope{apiKey, key}
	entry, replay, errStatus, apiErr := s.beginIdempotent(scope, r.Method+" "+r.URL.Path+"?"+r.PostForm.Encode())
	if apiErr != nil {
		writeError(w, errStatus, apiErr)
		return
	}
	if fault.Kind != FaultHoldResponse {
		time.Sleep(fault.Delay)
	}

	var status int
	var body []byte
	if replay {
		w.Header().Set("Idempotent-Replayed", "true")
		w.Header().Set("Original-Request", entry.requestID)
		status, body = entry.status, entry.body
	} else {
		var obj any
		var store bool
		obj, status, apiErr, store = exec(r.PostForm, key)
		if body = errorBody(apiErr); apiErr == nil {
			body = mustJSON(obj)
		}
		// Like Stripe, store results only once execution began: declines
		// and refused refunds are stored, validation errors are not (and
		// 5xx never are).
		s.finishIdempotent(scope, entry, status, body, w.Header().Get("Request-Id"), store)
	}
	if fault.Kind == FaultHoldResponse {
		// The charge (or refund) has happened; the caller just does not hear about it
		// yet. A test can kill the caller in this window.
		time.Sleep(fault.Delay)
	}
	if fault.Kind == FaultDropResponse {
		fakefault.DropConnection(w)
		return
	}
	writeRaw(w, status, body)
}

// beginIdempotent looks up scope. It returns the stored entry to replay, or an
// error to answer with, or marks a new entry in flight and returns it. Without
// a key it returns a nil entry.
func (s *Server) beginIdempotent(scope idemScope, fingerprint string) (e *idemEntry, replay bool, status int, apiErr *apiError) {
	if scope.key == "" {
		return nil, false, 0, nil
	}
	now := s.opts.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	if e := s.idem[scope]; e != nil && now.Sub(e.created) < s.opts.IdempotencyTTL {
		switch {
		case e.fingerprint != fingerprint:
			return nil, false, http.StatusBadRequest, &apiError{Type: "idempotency_error", Message: fmt.Sprintf(
				"Keys for idempotent requests can only be used with the same parameters they were first used with. Try using a key other than '%s' if you meant to execute a different request.", scope.key)}
		case !e.done:
			return nil, false, http.StatusConflict, &apiError{Type: "invalid_request_error", Code: "idempotency_key_in_use", Message: fmt.Sprintf(
				"There is currently another in-progress request using this Stripe-Idempotency-Key (that probably means you submitted twice, and the other request is still going through): %s. Please try again later.", scope.key)}
		}
		return e, true, 0, nil
	}
	e = &idemEntry{fingerprint: fingerprint, created: now}
	s.idem[scope] = e
	return e, false, 0, nil
}

// finishIdempotent stores the result in e, or forgets e if !store.
func (s *Server) finishIdempotent(scope idemScope, e *idemEntry, status int, body []byte, requestID string, store bool) {
	if e == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.idem[scope] != e { // Reset while in flight.
		return
	}
	if !store {
		delete(s.idem, scope)
		return
	}
	e.done, e.status, e.body, e.requestID = true, status, body, requestID
}

// refuseRefund is the executor of a refund that FaultRefuseRefund refuses:
// nothing is refunded, and the refusal is stored for idempotent replays.
func refuseRefund(p url.Values, _ string) (any, int, *apiError, bool) {
	return nil, http.StatusBadRequest, &apiError{Type: "invalid_request_error", Code: "charge_disputed",
		Message: fmt.Sprintf("The charge of %s has been disputed and cannot be refunded.", p.Get("payment_intent"))}, true
}
