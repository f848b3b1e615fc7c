package api

import (
	"net/http"

	"github.com/keyedhq/keyed/effects"
	"github.com/keyedhq/keyed/idempotency"
)

// Error codes in the "code" member of an error response. Clients branch on
// these, never on the message.
const (
	CodeUnauthorized          = "unauthorized"                    // 401: missing or unknown API key
	CodeMissingIdempotencyKey = idempotency.CodeMissingKey        // 400
	CodeInvalidIdempotencyKey = idempotency.CodeInvalidKey        // 400: empty, over 255 bytes, bad characters, or malformed quoting
	CodeBodyTooLarge          = idempotency.CodeBodyTooLarge      // 413: body over MaxBodyBytes
	CodeInvalidJSON           = "invalid_json"                    // 400: not one JSON object
	CodeUnknownField          = "unknown_field"                   // 400: a member the API does not know, or a known one in another case
	CodeDuplicateField        = "duplicate_field"                 // 400: a member sent twice
	CodeRequestTimeout        = "request_timeout"                 // 408: the body did not arrive within the server's read timeout
	CodeMissingField          = "missing_field"                   // 400
	CodeInvalidField          = "invalid_field"                   // 400: wrong type or value
	CodeIdempotencyKeyReused  = idempotency.CodeKeyReused         // 422: the key was first used with another request
	CodeRequestInProgress     = idempotency.CodeRequestInProgress // 409: the key's first request is still running
	CodeOrderConflict         = "order_conflict"                  // 409: the order ID exists with other details
	CodeRefundConflict        = "refund_conflict"                 // 409: the refund ID was requested with another amount or reason
	CodeOrderNotRefundable    = "order_not_refundable"            // 409: the order is not paid, or is refunded in full
	CodeRefundExceedsCharge   = "refund_exceeds_charge"           // 422: the refund is more than what is left of the charge
	CodeTooManyRefunds        = "too_many_refunds"                // 422: the order has refunds.MaxPerOrder refunds already
	CodeRateLimited           = "rate_limited"                    // 429: the tenant is over its rate limit (HandlerOpts.RateLimit); with Retry-After
	CodeNotFound              = "not_found"                       // 404
	CodeMethodNotAllowed      = "method_not_allowed"              // 405
	CodeUnavailable           = idempotency.CodeUnavailable       // 503: the database is down or did not answer in time; with Retry-After
	CodeInternal              = idempotency.CodeInternal          // 500: an unexpected failure, such as a missing migration
)

// Error is an API error: the HTTP status and the JSON body
// {"error":{"code":…,"field":…,"message":…}}. Field names the request member
// or header at fault, when there is one. It is the Idempotency-Key
// middleware's error, so that its answers and the API's are one shape.
type Error = idempotency.Error

// ErrorBody is the JSON body of every error response.
type ErrorBody struct {
	Error *Error `json:"error"`
}

func newError(status int, code, field, format string, args ...any) *Error {
	return idempotency.NewError(status, code, field, format, args...)
}

// echo quotes a value the caller sent and the API refused, cut short
// (idempotency.Echo).
func echo(s string) string { return idempotency.Echo(s) }

// short is echo without the quotes, for a method, a path or a JSON value.
func short(s string) string {
	if c, cut := idempotency.EchoCut(s); cut {
		return c + "..."
	}
	return s
}

func writeJSON(w http.ResponseWriter, status int, body []byte) {
	idempotency.WriteJSON(w, status, body)
}

func writeError(w http.ResponseWriter, e *Error) { idempotency.WriteError(w, e) }

// unavailable reports whether err means the database could not serve the
// request now, so a retry may succeed (503, not 500): effects.IsInfrastructure
// or a cancelled context. An error reported for the statement itself does not.
func unavailable(err error) bool {
	return effects.IsInfrastructure(err)
}
