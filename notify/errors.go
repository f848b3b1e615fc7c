package notify

import (
	"errors"
	"fmt"
	"time"

	"github.com/keyedhq/keyed/effects"
)

// Sentinel errors that callers branch on with errors.Is. A failed send also
// matches effects.ErrAmbiguous when it may or may not have gone out and
// SendGrid could not be asked.
var (
	// ErrInvalidMessage means a Message is missing a field or has a
	// malformed one. Nothing was claimed or sent.
	ErrInvalidMessage = errors.New("invalid message")

	// ErrRejected means SendGrid refused the message with a 4xx other than 429;
	// a retry will not help. The concrete error is a *SendError.
	ErrRejected = errors.New("email rejected by provider")

	// ErrUnavailable means SendGrid was unreachable or answered 429 or 5xx and
	// did not accept the message. Transient; a *SendError.
	ErrUnavailable = errors.New("email provider unavailable")

	// ErrUnconfirmed means the connection failed after the request may have been
	// written: SendGrid may have accepted it. Transient (the retry looks the key
	// up first); a *SendError.
	ErrUnconfirmed = errors.New("email send unconfirmed")

	// ErrLookupPending means an earlier attempt may have posted the message less
	// than LookupLag ago and SendGrid's index does not show it yet. Transient; a
	// *LookupError.
	ErrLookupPending = errors.New("waiting for SendGrid's activity index")

	// ErrLookupFailed means the Email Activity look-up failed while an earlier
	// attempt may have posted the message less than LookupLag+LookupGiveUp ago.
	// Transient; a *LookupError.
	ErrLookupFailed = errors.New("SendGrid email activity look-up failed")
)

// Error codes stored with a failed send's effect record (see effects.Coded).
const (
	// CodeRejected is stored for ErrRejected.
	CodeRejected = "send_rejected"
	// CodeUnavailable is stored for ErrUnavailable.
	CodeUnavailable = "send_unavailable"
	// CodeUnconfirmed is stored (as a transient failure) for ErrUnconfirmed.
	CodeUnconfirmed = "send_unconfirmed"
	// CodeLookupPending is stored (transient) for ErrLookupPending.
	CodeLookupPending = "lookup_pending"
	// CodeLookupFailed is stored (transient) for ErrLookupFailed.
	CodeLookupFailed = "lookup_failed"
	// CodeAmbiguous is stored, terminally, when an at-most-once send may have
	// gone out and SendGrid could not be asked in time (effects.CodeAmbiguous).
	CodeAmbiguous = effects.CodeAmbiguous
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
// CodeUnavailable or CodeUnconfirmed.
func (e *SendError) Code() string { return e.code }

// Unwrap returns ErrRejected, ErrUnavailable or ErrUnconfirmed.
func (e *SendError) Unwrap() error { return e.kind }

// LookupError describes an attempt that could not yet settle an earlier
// unfinished claim from SendGrid's Email Activity API: Key, Since (how long
// ago the earlier POST, or its claim, started), Status (of a failed look-up,
// or 0) and Reason (empty when nothing was found). Neither holds the API key.
type LookupError struct {
	Key    string
	Since  time.Duration
	Status int
	Reason string
	// Wait is how much longer the send keeps waiting before it is sent (or,
	// after a failing look-up at most once, declared ambiguous).
	Wait time.Duration
	code string
	kind error
}

func (e *LookupError) Error() string {
	since := e.Since.Round(time.Millisecond)
	switch e.code {
	case CodeLookupPending:
		return fmt.Sprintf("%s: no message under effect key %s yet, %s after the earlier attempt's POST; it is sent if none shows within %s more",
			e.kind, e.Key, since, e.Wait.Round(time.Millisecond))
	case CodeLookupFailed:
		return fmt.Sprintf("%s: %s, %s after the earlier attempt's POST of %s; retrying for %s more", e.kind, e.failure(), since, e.Key,
			e.Wait.Round(time.Millisecond))
	}
	return fmt.Sprintf("%s: %s may have been sent %s ago and SendGrid's email activity look-up kept failing (%s); it is not sent again",
		e.kind, e.Key, since, e.failure())
}

func (e *LookupError) failure() string {
	if e.Status == 0 {
		return e.Reason
	}
	return fmt.Sprintf("status %d: %s", e.Status, e.Reason)
}

// Code returns the code stored with the failed effect: CodeLookupPending,
// CodeLookupFailed or CodeAmbiguous.
func (e *LookupError) Code() string { return e.code }

// Unwrap returns ErrLookupPending, ErrLookupFailed or effects.ErrAmbiguous.
func (e *LookupError) Unwrap() error { return e.kind }
