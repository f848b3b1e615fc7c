package step

import (
	"context"
	"errors"
	"math/rand/v2"
	"slices"
	"strings"
	"time"

	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/temporal"

	"github.com/keyedhq/keyed/effects"
	"github.com/keyedhq/keyed/notify"
)

// Temporal error types of a step's failures. They are stable: recorded
// histories, retry policies and operators' searches name them. Each has one
// row in errorKinds.
const (
	ErrTypeInvalidInput      = "InvalidInput"      // unusable input or data; terminal
	ErrTypeNotFound          = "OrderNotFound"     // no such entity (the name predates other pipelines); terminal
	ErrTypeCardDeclined      = "CardDeclined"      // the card was declined; terminal
	ErrTypePaymentIncomplete = "PaymentIncomplete" // the payment needs the customer; terminal
	ErrTypeProviderRejected  = "ProviderRejected"  // the provider refused the request; terminal
	ErrTypeKeyReused         = "KeyReused"         // the key came back with other inputs; terminal
	ErrTypeAmbiguous         = "Ambiguous"         // the effect may or may not have happened; terminal
	ErrTypeInvalidState      = "InvalidState"      // the entity is not in the state the step needs; terminal
	ErrTypeTerminal          = "Terminal"          // anything unclassified; terminal
	ErrTypeTransient         = "Transient"         // a timeout, reset, 429 or 5xx; retried with the same key
	ErrTypeInProgress        = "InProgress"        // another owner holds a live claim; retried
	ErrTypeLeaseLost         = "LeaseLost"         // this attempt's claim was taken over; retried
)

// Codes an effect record stores for a failure, one per error type.
const (
	CodeInvalidInput      = "invalid_input"
	CodeNotFound          = "order_not_found"
	CodeCardDeclined      = "card_declined"
	CodePaymentIncomplete = "payment_incomplete"
	CodeProviderRejected  = "provider_rejected"
	CodeKeyReused         = "key_reused"
	CodeAmbiguous         = effects.CodeAmbiguous
	CodeInvalidState      = "invalid_state"
	CodeTerminal          = "terminal"
	CodeTransient         = "transient"
	CodeInProgress        = "in_progress"
	CodeLeaseLost         = "lease_lost"
)

// Sentinel errors of the error kinds. A domain error classifies as a kind
// by wrapping its sentinel (see Sentinel).
var (
	ErrInvalidInput        = errors.New("invalid input")
	ErrUnsupportedVersion  = errors.New("unsupported input version")
	ErrNotFound            = errors.New("not found")
	ErrInvalidState        = errors.New("not in the state this step needs")
	ErrCardDeclined        = errors.New("card declined")
	ErrPaymentIncomplete   = errors.New("payment not completed")
	ErrProviderRejected    = errors.New("request rejected by provider")
	ErrProviderUnavailable = errors.New("provider unavailable") // always marked transient
)

// errorKind is one row of the error table.
type errorKind struct {
	typ       string
	code      string
	sentinel  error
	retryable bool
	also      []error  // other sentinels that classify as typ
	legacy    []string // codes older records store for typ; read, never written
	todo      string   // what happens next and what an operator does
	// refusal: the step did not act and would refuse again, so its effect
	// cannot be decided done (RefusedForGood).
	refusal bool
	// attention is the reason a run waits for a decision when the step
	// ends with this type ("" means the outcome is known).
	attention string
}

// errorKinds is the error table: every error type, code, sentinel and
// attention reason in one place. Sentinels match in row order, so the
// retryable rows come first.
var errorKinds = []errorKind{
	{typ: ErrTypeLeaseLost, code: CodeLeaseLost, sentinel: effects.ErrLeaseLost, retryable: true, attention: "retries_exhausted",
		todo: "retrying; the next attempt finds the outcome"},
	{typ: ErrTypeInProgress, code: CodeInProgress, sentinel: effects.ErrInProgress, retryable: true, attention: "retries_exhausted",
		todo: "another attempt holds the claim; retrying when its lease ends"},
	{typ: ErrTypeTransient, code: CodeTransient, sentinel: ErrProviderUnavailable, retryable: true, attention: "retries_exhausted",
		todo: "retrying with the same effect key"},
	{typ: ErrTypeAmbiguous, code: CodeAmbiguous, sentinel: effects.ErrAmbiguous, attention: CodeAmbiguous,
		todo: "not retried: the outcome is unknown; check the provider's record for the effect key and decide"},
	{typ: ErrTypeKeyReused, code: CodeKeyReused, sentinel: effects.ErrKeyReused, attention: CodeKeyReused,
		todo: "not retried: the effect key came back with other inputs; compare them with the provider's record and decide"},
	{typ: ErrTypeNotFound, refusal: true, code: CodeNotFound, sentinel: ErrNotFound,
		todo: "not retried: the tenant has no such order"},
	{typ: ErrTypeInvalidInput, refusal: true, code: CodeInvalidInput, sentinel: ErrInvalidInput,
		also: []error{ErrUnsupportedVersion, effects.ErrInvalidKey, notify.ErrInvalidMessage},
		todo: "not retried: fix the input or the order's data, then start a new order"},
	{typ: ErrTypeInvalidState, refusal: true, code: CodeInvalidState, sentinel: ErrInvalidState,
		todo: "not retried: check the order's status"},
	{typ: ErrTypeProviderRejected, refusal: true, code: CodeProviderRejected, sentinel: ErrProviderRejected,
		also: []error{notify.ErrRejected}, legacy: []string{notify.CodeRejected},
		todo: "not retried: the provider refused the request; fix the data or the configuration"},
	{typ: ErrTypeCardDeclined, refusal: true, code: CodeCardDeclined, sentinel: ErrCardDeclined,
		todo: "not retried: the customer must pay with another card"},
	{typ: ErrTypePaymentIncomplete, refusal: true, code: CodePaymentIncomplete, sentinel: ErrPaymentIncomplete,
		todo: "not retried: the payment needs the customer (such as 3-D Secure)"},
	// "unclassified" is what effects stores for an error without a code.
	{typ: ErrTypeTerminal, code: CodeTerminal, legacy: []string{"unclassified"},
		todo: "not retried: read the worker log for the effect key"},
}

// terminalKind is the row of anything unrecognised.
var terminalKind, _ = kindOfType(ErrTypeTerminal)

func kindOfType(typ string) (errorKind, bool) {
	i := slices.IndexFunc(errorKinds, func(k errorKind) bool { return k.typ == typ })
	if i < 0 {
		return errorKind{}, false
	}
	return errorKinds[i], true
}

// kindOfCode returns the row that stores or reads code, else the terminal row.
func kindOfCode(code string) errorKind {
	i := slices.IndexFunc(errorKinds, func(k errorKind) bool { return k.code == code || slices.Contains(k.legacy, code) })
	if i < 0 {
		return terminalKind
	}
	return errorKinds[i]
}

// kindOfSentinel returns the first row, retryable or not, whose sentinels
// err matches.
func kindOfSentinel(err error, retryable bool) (errorKind, bool) {
	for _, k := range errorKinds {
		if k.retryable == retryable && k.matches(err) {
			return k, true
		}
	}
	return errorKind{}, false
}

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

// codeOf returns the code an effect record stores for errType, and
// CodeTerminal for a type the table does not know.
func codeOf(errType string) string {
	if k, ok := kindOfType(errType); ok {
		return k.code
	}
	return terminalKind.code
}

// AttentionReason returns why a run waits for an operator when a step ends
// with errType, such as "ambiguous", and false for a known outcome.
func AttentionReason(errType string) (string, bool) {
	k, ok := kindOfType(errType)
	return k.attention, ok && k.attention != ""
}

// RefusedForGood reports whether code, a terminal failure's stored code,
// says the step did not act and would refuse again: such an effect cannot
// be decided "done".
func RefusedForGood(code string) bool {
	return kindOfCode(code).refusal
}

// Error is a classified failure of a step: Type is its Temporal error type,
// Code what its effect record stores. Message never holds card data,
// addresses or secrets.
type Error struct {
	Type    string
	Message string
}

func (e *Error) Error() string { return e.Message }

// Code returns the code stored with the failed effect (codeOf(e.Type)).
func (e *Error) Code() string { return codeOf(e.Type) }

// Unwrap returns the sentinel of the failure's type, or nil.
func (e *Error) Unwrap() error {
	k, _ := kindOfType(e.Type)
	return k.sentinel
}

// Sentinel returns a sentinel error of a domain, with text as its message,
// that classifies as kind (one of this package's sentinels), such as
// Sentinel(ErrNotFound, "order not found").
func Sentinel(kind error, text string) error { return &sentinel{kind: kind, text: text} }

type sentinel struct {
	kind error
	text string
}

func (s *sentinel) Error() string { return s.text }
func (s *sentinel) Unwrap() error { return s.kind }

// ErrorType classifies err: its Temporal error type and whether Temporal may
// retry it. Transient errors (effects.IsTransient) are retryable whatever
// else the chain holds; then come an *Error's type, the terminal rows'
// sentinels and a stored failure's code. Anything else is terminal.
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

// operatorMessage returns the one line an operator reads for err of type
// errType: err's text on one line without repeated parts, then what
// happens next.
func operatorMessage(errType string, err error) string {
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

// inProcess carries a step's error as the cause of ToTemporal's error, for
// errors.Is and errors.As in the worker; its empty text keeps history from
// repeating every wrapped message.
type inProcess struct{ err error }

func (e *inProcess) Error() string   { return "" }
func (e *inProcess) Unwrap() []error { return []error{e.err} }

// ToTemporal turns a step's error into the one an activity returns: an
// application error of ErrorType's type with operatorMessage as its
// message, retryable only for transient failures, with err reachable
// through errors.Is and errors.As. Nil and application errors pass as they
// are.
func ToTemporal(err error) error {
	if err == nil {
		return nil
	}
	var app *temporal.ApplicationError
	if errors.As(err, &app) {
		return err
	}
	errType, retry := ErrorType(err)
	msg := operatorMessage(errType, err)
	if retry {
		return temporal.NewApplicationErrorWithCause(msg, errType, &inProcess{err})
	}
	return temporal.NewNonRetryableApplicationError(msg, errType, &inProcess{err})
}

// spread gives a retryable failure of an activity its own retry delay: the
// backoff its retry policy sets for this attempt, times 0.5 to 1.0.
// Temporal's backoff has no jitter, so steps that fail together (a burst
// meeting a provider's 429s, an outage's end) would come back together,
// fail together again, and let through only what the provider takes in
// their first second. An error that sets its own delay, a terminal one, or
// one outside an activity or the error table passes as it is.
func spread(ctx context.Context, err error) error {
	var app *temporal.ApplicationError
	if !activity.IsActivity(ctx) || !errors.As(err, &app) || app.NonRetryable() || app.NextRetryDelay() > 0 {
		return err
	}
	if k, ok := kindOfType(app.Type()); !ok || !k.retryable {
		return err
	}
	info := activity.GetInfo(ctx)
	p := info.RetryPolicy
	if p == nil {
		p = retryPolicy()
	}
	return temporal.NewApplicationErrorWithOptions(app.Message(), app.Type(), temporal.ApplicationErrorOptions{
		Cause: errors.Unwrap(app), NextRetryDelay: RetryDelay(p, info.Attempt, rand.Float64())})
}

// RetryDelay is the delay before attempt+1 under p (the policy's backoff
// after attempt, with Temporal's defaults for unset fields), times 0.5 +
// r/2 for r in [0, 1).
func RetryDelay(p *temporal.RetryPolicy, attempt int32, r float64) time.Duration {
	d, coef, most := p.InitialInterval, p.BackoffCoefficient, p.MaximumInterval
	if d <= 0 {
		d = time.Second
	}
	if coef < 1 {
		coef = 2
	}
	if most <= 0 {
		most = 100 * d
	}
	for i := int32(1); i < attempt && d < most; i++ {
		d = min(time.Duration(float64(d)*coef), most)
	}
	return time.Duration(float64(min(d, most)) * (0.5 + r/2))
}
