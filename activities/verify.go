package activities

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/keyedhq/keyed/effects"
)

// Sentinels of a Verify's verdict. A Verify returns nil when the record
// confirms the outcome, an error wrapping ErrContradicted when it
// contradicts it, and any other error (ErrUnverifiable, through
// Unverifiable) when it could not be read.
var (
	// ErrContradicted means the provider's record (or the database's, for a
	// write) contradicts an operator's "done" outcome: no such object,
	// another amount, another effect key, not succeeded. The decision is
	// refused.
	ErrContradicted = errors.New("contradicted by the record")
	// ErrUnverifiable means the record could not be read: the provider did
	// not answer, refused the look-up (a key without the scope, a missing
	// add-on) or is not configured. The decision is refused unless the
	// operator overrides it.
	ErrUnverifiable = errors.New("the record could not be read")
)

// Verify checks the outcome an operator decided "done" for the step whose
// effect key is key against the record of the provider (or of the
// database, for a write): outcome is what the step's Declaration.Outcome
// decoded. See the sentinels for its verdicts; the error's text says why,
// for the operator. It must not change anything the step's effect would.
type Verify func(ctx context.Context, key effects.Key, outcome any) error

// Contradicted returns an error wrapping ErrContradicted whose text is the
// formatted reason, such as "Stripe has no PaymentIntent pi_1".
func Contradicted(format string, args ...any) error {
	return &verdict{kind: ErrContradicted, msg: fmt.Sprintf(format, args...)}
}

// Unverifiable returns an error wrapping ErrUnverifiable whose text is the
// formatted reason, such as "Stripe did not answer: connection refused".
func Unverifiable(format string, args ...any) error {
	return &verdict{kind: ErrUnverifiable, msg: fmt.Sprintf(format, args...)}
}

type verdict struct {
	kind error
	msg  string
}

func (v *verdict) Error() string { return v.msg }
func (v *verdict) Unwrap() error { return v.kind }

// Verifier adapts fn, which checks the step's outcome as its type T, to a
// Verify for Definition.Verify.
func (k KeyedOf[In, T]) Verifier(fn func(ctx context.Context, key effects.Key, outcome T) error) Verify {
	return verifier(k.Step, fn)
}

// Verifier adapts fn, which checks the step's outcome as its type T, to a
// Verify for Definition.Verify.
func (k Keyed[T]) Verifier(fn func(ctx context.Context, key effects.Key, outcome T) error) Verify {
	return verifier(k.Step, fn)
}

func verifier[T any](step string, fn func(context.Context, effects.Key, T) error) Verify {
	return func(ctx context.Context, key effects.Key, outcome any) error {
		v, ok := outcome.(T)
		if !ok {
			return Unverifiable("%s %s: the outcome to check is a %T, not the step's", strings.ReplaceAll(step, "_", " "), key, outcome)
		}
		return fn(ctx, key, v)
	}
}

// Declare returns the order step declared by d whose outcome is T, with
// d.Outcome set to OutcomeOf[T] unless d has one: the one place a step's
// outcome type and the rule for an operator's "done" meet.
func Declare[T any](d Declaration) Keyed[T] {
	if d.Outcome == nil {
		d.Outcome = OutcomeOf[T]()
	}
	return Keyed[T]{d}
}

// DeclareOf returns the step of input In declared by d whose outcome is T,
// with d.Outcome set to OutcomeOf[T] unless d has one, as Declare does.
func DeclareOf[In Input, T any](d Declaration) KeyedOf[In, T] {
	if d.Outcome == nil {
		d.Outcome = OutcomeOf[T]()
	}
	return KeyedOf[In, T]{d}
}

// RefusedForGood reports whether code, the error code of an effect record
// that failed terminally, says the step refused deterministically: it did
// not act and would refuse again (an invalid input or state, no order, a
// decline, the provider's refusal). Such an effect cannot be decided
// "done". Ambiguous, a reused key and an unclassified failure leave open
// whether it happened.
func RefusedForGood(code string) bool {
	return kindOfCode(code).refusal
}
