package notify

import (
	"errors"
	"fmt"
)

// Sentinel errors that callers branch on with errors.Is. A failed send also
// matches effects.ErrAmbiguous when it may or may not have gone out.
var (
	// ErrInvalidMessage means a Message is missing a field or has a
	// malformed one. Nothing was claimed or sent.
	ErrInvalidMessage = errors.New("invalid message")

	// ErrRejected means SendGrid refused the message with a 4xx other than
	// 429: a bad address, a bad API key, a malformed request. Retrying the
	// same request will not help. The concrete error is a *SendError.
	ErrRejected = errors.New("email rejected by provider")

	// ErrUnavailable means SendGrid could not be reached or answered 429 or
	// 5xx, and the message was not accepted. It is marked transient, so a
	// later attempt sends. The concrete error is a *SendError.
	ErrUnavailable = errors.New("email provider unavailable")
)

// Error codes stored with a failed send's effect record (see effects.Coded).
const (
	// CodeRejected is stored for ErrRejected.
	CodeRejected = "send_rejected"
	// CodeUnavailable is stored for ErrUnavailable.
	CodeUnavailable = "send_unavailable"
	// CodeAmbiguous is stored when the send may have gone out; it is the
	// same code effects.Do stores for an abandoned at-most-once claim.
	CodeAmbiguous = "ambiguous"
)

// SendError describes a mail send call that failed. Status is the HTTP
// status, or 0 when no response arrived. Reason is SendGrid's first error
// message or the transport error; it never contains the body or the API key.
type SendError struct {
	Status int
	Reason string
	code   string
	kind   error
}

func (e *SendError) Error() string {
	if e.Status == 0 {
		return fmt.Sprintf("%s: %s", e.kind, e.Reason)
	}
	return fmt.Sprintf("%s: status %d: %s", e.kind, e.Status, e.Reason)
}

// Code returns the code stored with the failed effect: CodeRejected,
// CodeUnavailable or CodeAmbiguous.
func (e *SendError) Code() string { return e.code }

// Unwrap returns ErrRejected, ErrUnavailable or effects.ErrAmbiguous.
func (e *SendError) Unwrap() error { return e.kind }
