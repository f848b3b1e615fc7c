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
// histories for them.
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

// NonRetryableErrorTypes returns the terminal error types, for a retry
// policy's NonRetryableErrorTypes.
func NonRetryableErrorTypes() []string {
	return []string{ErrTypeInvalidInput, ErrTypeOrderNotFound, ErrTypeCardDeclined, ErrTypePaymentIncomplete,
		ErrTypeProviderRejected, ErrTypeKeyReused, ErrTypeAmbiguous, ErrTypeInvalidState, ErrTypeTerminal}
}

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

// Error is a classified failure of a step. Type is its Temporal error type
// (one of the ErrType constants); its Code, the snake_case form of Type, is
// what the effect record stores, so that a second run that reads the stored
// failure reports the same Type. Message never holds card data, addresses or
// secrets.
type Error struct {
	Type    string
	Message string
	kind    error
}

func (e *Error) Error() string { return e.Message }

// Code returns the code stored with the failed effect, such as
// "card_declined" for ErrTypeCardDeclined.
func (e *Error) Code() string {
	if code, ok := codeByType[e.Type]; ok {
		return code
	}
	return "terminal"
}

// Unwrap returns the sentinel error of the failure's kind.
func (e *Error) Unwrap() error { return e.kind }

// typeByCode maps stored effect failure codes back to error types.
var typeByCode = map[string]string{
	"invalid_input":      ErrTypeInvalidInput,
	"order_not_found":    ErrTypeOrderNotFound,
	"card_declined":      ErrTypeCardDeclined,
	"payment_incomplete": ErrTypePaymentIncomplete,
	"provider_rejected":  ErrTypeProviderRejected,
	"key_reused":         ErrTypeKeyReused,
	"ambiguous":          ErrTypeAmbiguous, // Also effects.Do's and notify.CodeAmbiguous.
	"invalid_state":      ErrTypeInvalidState,
	"terminal":           ErrTypeTerminal,
	"transient":          ErrTypeTransient,
	notify.CodeRejected:  ErrTypeProviderRejected,
}

// codeByType is the one stored code of each error type: typeByCode maps two
// codes to ErrTypeProviderRejected, so it cannot be inverted.
var codeByType = map[string]string{
	ErrTypeInvalidInput:      "invalid_input",
	ErrTypeOrderNotFound:     "order_not_found",
	ErrTypeCardDeclined:      "card_declined",
	ErrTypePaymentIncomplete: "payment_incomplete",
	ErrTypeProviderRejected:  "provider_rejected",
	ErrTypeKeyReused:         "key_reused",
	ErrTypeAmbiguous:         "ambiguous",
	ErrTypeInvalidState:      "invalid_state",
	ErrTypeTerminal:          "terminal",
	ErrTypeTransient:         "transient",
}

var retryable = map[string]bool{ErrTypeTransient: true, ErrTypeInProgress: true, ErrTypeLeaseLost: true}

// ErrorType classifies err: its Temporal error type and whether Temporal may
// retry it. Transient errors (effects.IsTransient: marked transient, a claim
// in progress, or an infrastructure failure such as a lost Postgres
// connection, a deadline or a shutdown) are retryable, whatever else the
// chain holds: an attempt that could not even store its outcome is retried
// with the same key. Everything else, including anything unrecognised, is
// terminal.
func ErrorType(err error) (errType string, retry bool) {
	var app *temporal.ApplicationError
	var own *Error
	var stored *effects.TerminalError
	switch {
	case err == nil:
		return "", false
	case errors.As(err, &app):
		return app.Type(), !app.NonRetryable()
	case errors.Is(err, effects.ErrLeaseLost):
		return ErrTypeLeaseLost, true
	case errors.Is(err, effects.ErrInProgress):
		return ErrTypeInProgress, true
	case effects.IsTransient(err):
		return ErrTypeTransient, true
	case errors.As(err, &own):
		return own.Type, retryable[own.Type]
	case errors.Is(err, effects.ErrAmbiguous):
		return ErrTypeAmbiguous, false
	case errors.As(err, &stored):
		if t, ok := typeByCode[stored.Code]; ok {
			return t, retryable[t]
		}
		return ErrTypeTerminal, false
	case errors.Is(err, effects.ErrKeyReused):
		return ErrTypeKeyReused, false
	case errors.Is(err, orders.ErrNotFound):
		return ErrTypeOrderNotFound, false
	case errors.Is(err, orders.ErrUnsupportedVersion), errors.Is(err, effects.ErrInvalidKey),
		errors.Is(err, orders.ErrInvalid), errors.Is(err, notify.ErrInvalidMessage):
		return ErrTypeInvalidInput, false
	case errors.Is(err, orders.ErrBadTransition):
		return ErrTypeInvalidState, false
	case errors.Is(err, notify.ErrRejected):
		return ErrTypeProviderRejected, false
	}
	return ErrTypeTerminal, false
}

// todo says, per error type, whether Temporal retries and what an operator
// does about it: the end of the one-line message ToTemporal writes.
var todo = map[string]string{
	ErrTypeInvalidInput:      "not retried: fix the input or the order's data, then start a new order",
	ErrTypeOrderNotFound:     "not retried: the tenant has no such order",
	ErrTypeCardDeclined:      "not retried: the customer must pay with another card",
	ErrTypePaymentIncomplete: "not retried: the payment needs the customer (such as 3-D Secure)",
	ErrTypeProviderRejected:  "not retried: the provider refused the request; fix the data or the configuration",
	ErrTypeKeyReused:         "not retried: the effect key came back with other inputs; compare them with the provider's record and decide",
	ErrTypeAmbiguous:         "not retried: the outcome is unknown; check the provider's record for the effect key and decide",
	ErrTypeInvalidState:      "not retried: check the order's status",
	ErrTypeTerminal:          "not retried: read the worker log for the effect key",
	ErrTypeTransient:         "retrying with the same effect key",
	ErrTypeInProgress:        "another attempt holds the claim; retrying when its lease ends",
	ErrTypeLeaseLost:         "retrying; the next attempt finds the outcome",
}

// OperatorMessage returns the one line an operator reads for err of type
// errType: err's text (which names the step, the effect key and the
// provider's code where there is one) on one line, with repeated parts
// dropped, then whether it is retried and what to do. It never holds more
// than err's text already does.
func OperatorMessage(errType string, err error) string {
	what := todo[errType]
	if what == "" {
		what = "not retried"
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
