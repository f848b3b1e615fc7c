package activities

import (
	"errors"
	"slices"
	"strings"

	"go.temporal.io/sdk/temporal"

	"github.com/keyedhq/keyed/effects"
	"github.com/keyedhq/keyed/notify"
	"github.com/keyedhq/keyed/orders"
)

// Temporal error types of the activities' failures. They are stable: the
// workflow lists the terminal ones in its retry policy, and operators search
// histories for them. Each has one row in errorKinds, which says its stored
// code, its sentinel and whether Temporal retries it.
const (
	// ErrTypeInvalidInput: the input has an unsupported version or cannot
	// form an effect key, or a message could not be built. Terminal.
	ErrTypeInvalidInput = "InvalidInput"
	// ErrTypeOrderNotFound: the tenant has no such order. Terminal.
	ErrTypeOrderNotFound = "OrderNotFound"
	// ErrTypeCardDeclined: Stripe declined the card (card_error). Terminal.
	ErrTypeCardDeclined = "CardDeclined"
	// ErrTypePaymentIncomplete: the payment intent ended in a status other
	// than succeeded, such as requires_action. Terminal.
	ErrTypePaymentIncomplete = "PaymentIncomplete"
	// ErrTypeProviderRejected: Stripe or SendGrid refused the request as
	// invalid (a 4xx that is not a decline, a 409 or a 429). Terminal.
	ErrTypeProviderRejected = "ProviderRejected"
	// ErrTypeKeyReused: the effect key came back with other inputs, at keyed
	// or at Stripe (idempotency_error). Terminal.
	ErrTypeKeyReused = "KeyReused"
	// ErrTypeAmbiguous: an at-most-once effect may or may not have happened
	// and will not be repeated; an operator must look. Terminal.
	ErrTypeAmbiguous = "Ambiguous"
	// ErrTypeInvalidState: the order is not in the state the step needs,
	// such as a charge for an order that is already paid. Terminal.
	ErrTypeInvalidState = "InvalidState"
	// ErrTypeTerminal: any other failure. Unclassified errors are terminal,
	// so that they surface instead of looping. Terminal.
	ErrTypeTerminal = "Terminal"

	// ErrTypeTransient: a timeout, a reset connection, a 429 or a 5xx, from
	// a provider or from Postgres. Retryable, with the same effect key.
	ErrTypeTransient = "Transient"
	// ErrTypeInProgress: another owner holds a live claim on the effect.
	// Retryable: it finishes, or its lease runs out.
	ErrTypeInProgress = "InProgress"
	// ErrTypeLeaseLost: this attempt's claim was taken over while it
	// worked, so it stopped. Retryable: the next attempt finds the outcome.
	ErrTypeLeaseLost = "LeaseLost"
)

// Sentinel errors wrapped by the activities' *Error values.
var (
	// ErrInvalidInput means the input or the data it points to is unusable.
	ErrInvalidInput = errors.New("invalid input")
	// ErrCardDeclined means the card was declined.
	ErrCardDeclined = errors.New("card declined")
	// ErrPaymentIncomplete means the payment did not reach succeeded.
	ErrPaymentIncomplete = errors.New("payment not completed")
	// ErrProviderRejected means a provider refused the request.
	ErrProviderRejected = errors.New("request rejected by provider")
	// ErrProviderUnavailable means a provider did not answer, or answered
	// 429 or 5xx. It is always marked transient.
	ErrProviderUnavailable = errors.New("provider unavailable")
	// ErrInvalidState means the order is not in the state the step needs.
	ErrInvalidState = errors.New("order in wrong state for this step")
)

// errorKind is one row of the error table: a Temporal error type, the one
// code an effect record stores for it, the sentinel an *Error of the type
// unwraps to, and whether Temporal retries it.
type errorKind struct {
	typ       string
	code      string
	sentinel  error
	retryable bool
	// also lists other packages' sentinels that classify as typ.
	also []error
	// legacy lists codes that older records (or other packages) store for
	// typ. They are read back as typ but never written.
	legacy []string
	// todo says whether Temporal retries and what an operator does: the
	// end of the one-line message ToTemporal writes.
	todo string
	// refusal says the step refused deterministically: it did not act and
	// would refuse again, so its effect cannot be decided done
	// (RefusedForGood).
	refusal bool
}

// errorKinds is the error table: every error type, code and sentinel of the
// activities, in one place. NonRetryableErrorTypes, (*Error).Code,
// (*Error).Unwrap, ErrorType and ToTemporal all read it. ErrorType matches
// sentinels in row order, so the retryable rows come first. Types and codes
// (legacy ones included) are unique; errors_test.go checks it.
var errorKinds = []errorKind{
	{typ: ErrTypeLeaseLost, code: "lease_lost", sentinel: effects.ErrLeaseLost, retryable: true,
		todo: "retrying; the next attempt finds the outcome"},
	{typ: ErrTypeInProgress, code: "in_progress", sentinel: effects.ErrInProgress, retryable: true,
		todo: "another attempt holds the claim; retrying when its lease ends"},
	{typ: ErrTypeTransient, code: "transient", sentinel: ErrProviderUnavailable, retryable: true,
		todo: "retrying with the same effect key"},
	// "ambiguous" is also what effects.Do and notify (CodeAmbiguous) store.
	{typ: ErrTypeAmbiguous, code: "ambiguous", sentinel: effects.ErrAmbiguous,
		todo: "not retried: the outcome is unknown; check the provider's record for the effect key and decide"},
	{typ: ErrTypeKeyReused, code: "key_reused", sentinel: effects.ErrKeyReused,
		todo: "not retried: the effect key came back with other inputs; compare them with the provider's record and decide"},
	{typ: ErrTypeOrderNotFound, refusal: true, code: "order_not_found", sentinel: orders.ErrNotFound,
		todo: "not retried: the tenant has no such order"},
	{typ: ErrTypeInvalidInput, refusal: true, code: "invalid_input", sentinel: ErrInvalidInput,
		also: []error{orders.ErrUnsupportedVersion, effects.ErrInvalidKey, orders.ErrInvalid, notify.ErrInvalidMessage},
		todo: "not retried: fix the input or the order's data, then start a new order"},
	{typ: ErrTypeInvalidState, refusal: true, code: "invalid_state", sentinel: ErrInvalidState, also: []error{orders.ErrBadTransition},
		todo: "not retried: check the order's status"},
	{typ: ErrTypeProviderRejected, refusal: true, code: "provider_rejected", sentinel: ErrProviderRejected,
		also: []error{notify.ErrRejected}, legacy: []string{notify.CodeRejected},
		todo: "not retried: the provider refused the request; fix the data or the configuration"},
	{typ: ErrTypeCardDeclined, refusal: true, code: "card_declined", sentinel: ErrCardDeclined,
		todo: "not retried: the customer must pay with another card"},
	{typ: ErrTypePaymentIncomplete, refusal: true, code: "payment_incomplete", sentinel: ErrPaymentIncomplete,
		todo: "not retried: the payment needs the customer (such as 3-D Secure)"},
	// "unclassified" is what effects stores for an error without a code.
	{typ: ErrTypeTerminal, code: "terminal", legacy: []string{"unclassified"},
		todo: "not retried: read the worker log for the effect key"},
}

// terminalKind is the row of ErrTypeTerminal, the kind of anything
// unrecognised.
var terminalKind, _ = kindOfType(ErrTypeTerminal)

// kindOfType returns the row of error type typ.
func kindOfType(typ string) (errorKind, bool) {
	i := slices.IndexFunc(errorKinds, func(k errorKind) bool { return k.typ == typ })
	if i < 0 {
		return errorKind{}, false
	}
	return errorKinds[i], true
}

// kindOfCode returns the row that stores code, or reads it as a legacy
// code, and the ErrTypeTerminal row for any other code.
func kindOfCode(code string) errorKind {
	i := slices.IndexFunc(errorKinds, func(k errorKind) bool { return k.code == code || slices.Contains(k.legacy, code) })
	if i < 0 {
		return terminalKind
	}
	return errorKinds[i]
}

// kindOfSentinel returns the first row whose sentinels err matches, among
// the retryable rows or among the terminal ones.
func kindOfSentinel(err error, retryable bool) (errorKind, bool) {
	for _, k := range errorKinds {
		if k.retryable == retryable && k.matches(err) {
			return k, true
		}
	}
	return errorKind{}, false
}

// matches reports whether err wraps the row's sentinel or one of its
// other sentinels.
func (k errorKind) matches(err error) bool {
	if k.sentinel != nil && errors.Is(err, k.sentinel) {
		return true
	}
	return slices.ContainsFunc(k.also, func(s error) bool { return errors.Is(err, s) })
}

// NonRetryableErrorTypes returns the terminal error types, for a retry
// policy's NonRetryableErrorTypes.
func NonRetryableErrorTypes() []string {
	var types []string
	for _, k := range errorKinds {
		if !k.retryable {
			types = append(types, k.typ)
		}
	}
	return types
}

// Error is a classified failure of a step. Type is its Temporal error type
// (one of the ErrType constants); its Code is what the effect record stores,
// so that a second run that reads the stored failure reports the same Type.
// Message never holds card data, addresses or secrets.
type Error struct {
	Type    string
	Message string
	// kind is the sentinel Unwrap returns; nil means the sentinel of Type's
	// row in the error table.
	kind error
}

func (e *Error) Error() string { return e.Message }

// Code returns the one code stored with the failed effect, such as
// "card_declined" for ErrTypeCardDeclined, and "terminal" for a type the
// error table does not know.
func (e *Error) Code() string {
	if k, ok := kindOfType(e.Type); ok {
		return k.code
	}
	return terminalKind.code
}

// Unwrap returns the sentinel error of the failure's kind, such as
// ErrCardDeclined for ErrTypeCardDeclined, or nil when it has none.
func (e *Error) Unwrap() error {
	if e.kind != nil {
		return e.kind
	}
	k, _ := kindOfType(e.Type)
	return k.sentinel
}

// ErrorType classifies err: its Temporal error type and whether Temporal may
// retry it. Transient errors (effects.IsTransient: marked transient, a claim
// in progress, or an infrastructure failure such as a lost Postgres
// connection, a deadline or a shutdown) are retryable, whatever else the
// chain holds: an attempt that could not even store its outcome is retried
// with the same key. Then come an *Error's own type, the sentinels of the
// error table's terminal rows, and a stored failure's code. Everything
// else, including anything unrecognised, is terminal.
func ErrorType(err error) (errType string, retry bool) {
	var app *temporal.ApplicationError
	var own *Error
	var stored *effects.TerminalError
	if err == nil {
		return "", false
	}
	if errors.As(err, &app) {
		return app.Type(), !app.NonRetryable()
	}
	if k, ok := kindOfSentinel(err, true); ok {
		return k.typ, true
	}
	if effects.IsTransient(err) {
		return ErrTypeTransient, true
	}
	if errors.As(err, &own) {
		k, _ := kindOfType(own.Type)
		return own.Type, k.retryable
	}
	if k, ok := kindOfSentinel(err, false); ok {
		return k.typ, false
	}
	if errors.As(err, &stored) {
		k := kindOfCode(stored.Code)
		return k.typ, k.retryable
	}
	return ErrTypeTerminal, false
}

// OperatorMessage returns the one line an operator reads for err of type
// errType: err's text (which names the step, the effect key and the
// provider's code where there is one) on one line, with repeated parts
// dropped, then whether it is retried and what to do. It never holds more
// than err's text already does.
func OperatorMessage(errType string, err error) string {
	what := "not retried"
	if k, ok := kindOfType(errType); ok {
		what = k.todo
	}
	return errType + ": " + oneLine(err.Error()) + " — " + what
}

// oneLine puts s on one line and drops each ": "-separated part that is
// empty or repeats an earlier one, as wrapped errors do.
func oneLine(s string) string {
	s = strings.Join(strings.Fields(s), " ")
	var parts []string
	for _, p := range strings.Split(s, ": ") {
		if p != "" && !slices.Contains(parts, p) {
			parts = append(parts, p)
		}
	}
	return strings.Join(parts, ": ")
}

// inProcess carries a step's original error as the cause of the error
// ToTemporal returns, for errors.Is and errors.As in the worker. Its text is
// empty and it unwraps as a list, so that the SDK serializes it as one
// empty level instead of repeating every wrapped message in history.
type inProcess struct{ err error }

func (e *inProcess) Error() string   { return "" }
func (e *inProcess) Unwrap() []error { return []error{e.err} }

// ToTemporal turns a step's error into the error an activity returns to
// Temporal: a retryable *temporal.ApplicationError for transient failures, a
// non-retryable one (temporal.NewNonRetryableApplicationError) for all
// others, with the type from ErrorType and OperatorMessage as its message;
// err stays reachable with errors.Is and errors.As. It returns nil for nil,
// and an error that already is an ApplicationError unchanged. Every
// activity returns its errors through it.
func ToTemporal(err error) error {
	if err == nil {
		return nil
	}
	var app *temporal.ApplicationError
	if errors.As(err, &app) {
		return err
	}
	errType, retry := ErrorType(err)
	msg := OperatorMessage(errType, err)
	if retry {
		return temporal.NewApplicationErrorWithCause(msg, errType, &inProcess{err})
	}
	return temporal.NewNonRetryableApplicationError(msg, errType, &inProcess{err})
}
