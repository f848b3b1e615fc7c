package effects

import (
	"errors"
	"fmt"
	"time"
)

// Sentinel errors that callers branch on with errors.Is.
var (
	// ErrInProgress means another owner holds a live claim on the key. The
	// effect may be happening right now; retry after the lease runs out. The
	// concrete error is an *InProgressError.
	ErrInProgress = errors.New("effect in progress")

	// ErrKeyReused means the key was claimed before with a different
	// fingerprint: two different requests are sharing one key. The concrete
	// error is a *KeyReusedError. It is never retryable.
	ErrKeyReused = errors.New("effect key reused with different inputs")

	// ErrTerminal means the effect failed terminally before and the stored
	// failure is being returned. The concrete error is a *TerminalError.
	ErrTerminal = errors.New("effect failed terminally")

	// ErrLeaseLost means the caller's claim is no longer its own: the lease
	// ran out and another owner took over, or the record was completed. The
	// caller must stop working on the effect.
	ErrLeaseLost = errors.New("effect lease lost")

	// ErrAmbiguous means an at-most-once effect was claimed by an earlier
	// attempt that did not report back, so it may or may not have happened.
	// keyed will not repeat it; the claim stays visible for an operator.
	ErrAmbiguous = errors.New("effect outcome unknown; not repeating an at-most-once effect")

	// ErrNotFound means no record exists for the key.
	ErrNotFound = errors.New("effect record not found")

	// ErrResultTooLarge means the outcome passed to Complete is larger than
	// MaxResultBytes. Effect records keep outcomes, not payloads.
	ErrResultTooLarge = errors.New("effect result too large")

	// ErrLateNotBefore means a claim's NotBefore is more than an hour
	// later than the claim itself: it is not when a record the key derives
	// from was created. Nothing is claimed; it is never retryable.
	ErrLateNotBefore = errors.New("effect claim's NotBefore is later than the claim")

	// ErrNoSchema means the search_path names no existing schema: there is
	// nowhere to create keyed_effects (Migrator).
	ErrNoSchema = errors.New("the search_path names no existing schema")
)

// CodeAmbiguous is the code a record stores when an at-most-once effect
// may or may not have happened (ErrAmbiguous).
const CodeAmbiguous = "ambiguous"

// InProgressError is returned when another owner holds a live claim.
type InProgressError struct {
	Key        string
	Owner      string
	LeaseUntil time.Time
}

func (e *InProgressError) Error() string {
	return fmt.Sprintf("%s: %s is held by %q until %s", ErrInProgress, e.Key, e.Owner, e.LeaseUntil.UTC().Format(time.RFC3339))
}

// Unwrap returns ErrInProgress.
func (e *InProgressError) Unwrap() error { return ErrInProgress }

// KeyReusedError is returned when a key comes back with another fingerprint.
type KeyReusedError struct {
	Key string
}

func (e *KeyReusedError) Error() string {
	return fmt.Sprintf("%s: %s was first claimed with a different fingerprint", ErrKeyReused, e.Key)
}

// Unwrap returns ErrKeyReused.
func (e *KeyReusedError) Unwrap() error { return ErrKeyReused }

// TerminalError carries a stored terminal failure. Code is the short
// machine-readable cause recorded by Fail, such as "card_declined".
type TerminalError struct {
	Key     string
	Code    string
	Message string
}

func (e *TerminalError) Error() string {
	return fmt.Sprintf("%s: %s: %s: %s", ErrTerminal, e.Key, e.Code, e.Message)
}

// Unwrap returns ErrTerminal.
func (e *TerminalError) Unwrap() error { return ErrTerminal }

// transientError marks an error as worth retrying. See Transient.
type transientError struct{ err error }

func (e *transientError) Error() string { return e.err.Error() }
func (e *transientError) Unwrap() error { return e.err }

// Transient marks err as transient (a timeout, a reset, a 429, a 5xx): Fail
// stores it so that the next claim takes the key again. Unmarked errors are
// terminal. Transient(nil) returns nil.
func Transient(err error) error {
	if err == nil {
		return nil
	}
	return &transientError{err: err}
}

// IsTransient reports whether err wraps an error marked Transient, an
// *InProgressError or an infrastructure failure (IsInfrastructure): cases
// where another attempt with the same key may pass.
func IsTransient(err error) bool {
	var t *transientError
	return errors.As(err, &t) || errors.Is(err, ErrInProgress) || IsInfrastructure(err)
}

// Coded is implemented by errors that carry a short machine-readable code.
// Fail stores the code of the first error in the chain that implements it.
type Coded interface {
	error
	Code() string
}

// CodedError is a terminal error with a code, for callers that have no typed
// error of their own.
type CodedError struct {
	code    string
	message string
}

// NewCodedError returns an error whose Code is code.
func NewCodedError(code, message string) *CodedError {
	return &CodedError{code: code, message: message}
}

func (e *CodedError) Error() string { return e.code + ": " + e.message }

// Code returns the error's code.
func (e *CodedError) Code() string { return e.code }

func errorCode(err error) string {
	var c Coded
	if errors.As(err, &c) {
		return c.Code()
	}
	if IsTransient(err) {
		return "transient"
	}
	return "unclassified"
}
