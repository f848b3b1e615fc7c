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

	// ErrRejected means SendGrid refused the message with a 4xx other than
	// 429: a bad address, a bad API key, a malformed request. Retrying the
	// same request will not help. The concrete error is a *SendError.
	ErrRejected = errors.New("email rejected by provider")

	// ErrUnavailable means SendGrid could not be reached or answered 429 or
	// 5xx, and the message was not accepted. It is marked transient, so a
	// later attempt sends. The concrete error is a *SendError.
	ErrUnavailable = errors.New("email provider unavailable")

	// ErrUnconfirmed means the connection failed after the mail send request
	// may have been written (a timeout, a reset, a lost response): SendGrid
	// may have accepted the message. It is marked transient; the retry looks
	// the effect key up before it sends. The concrete error is a *SendError.
	ErrUnconfirmed = errors.New("email send unconfirmed")

	// ErrLookupPending means an earlier attempt may have posted the message
	// less than LookupLag ago and SendGrid's Email Activity index does not
	// show it yet. It is marked transient: a later attempt looks again and
	// sends only once the lag window has passed with no match. The concrete
	// error is a *LookupError.
	ErrLookupPending = errors.New("waiting for SendGrid's activity index")

	// ErrLookupFailed means the Email Activity look-up failed (unreachable,
	// timeout, 429, 5xx, or 401/403 for a key without the Email Activity
	// scope) while an earlier attempt may have posted the message less than
	// LookupLag+LookupGiveUp ago. It is marked transient. The concrete error
	// is a *LookupError.
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
	// CodeLookupPending is stored (as a transient failure) for
	// ErrLookupPending.
	CodeLookupPending = "lookup_pending"
	// CodeLookupFailed is stored (as a transient failure) for
	// ErrLookupFailed.
	CodeLookupFailed = "lookup_failed"
	// CodeAmbiguous is stored, terminally, when an at-most-once send may
	// have gone out and SendGrid could not be asked within the bound; it is
	// the same code effects.Do stores for an abandoned at-most-once claim.
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
