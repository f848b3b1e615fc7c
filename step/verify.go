package step

import (
	"context"
	"errors"
	"fmt"

	"github.com/keyedhq/keyed/effects"
	"github.com/keyedhq/keyed/notify"
)

// Verdicts of a Verify: nil confirms the outcome, an error wrapping
// ErrContradicted refuses it, any other error (ErrUnverifiable) means the
// record could not be read.
var (
	ErrContradicted = errors.New("contradicted by the record")
	ErrUnverifiable = errors.New("the record could not be read")
)

// Verify checks the outcome an operator decided "done" for the step whose
// effect key is key against the provider's (or the database's) record;
// outcome is what the step's Declaration.Outcome decoded. It must not
// change anything the step's effect would.
type Verify func(ctx context.Context, key effects.Key, outcome any) error

// Contradicted returns an error wrapping ErrContradicted with the
// formatted reason, such as "Stripe has no PaymentIntent pi_1".
func Contradicted(format string, args ...any) error {
	return &verdict{kind: ErrContradicted, msg: fmt.Sprintf(format, args...)}
}

// Unverifiable returns an error wrapping ErrUnverifiable with the
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

// ConfirmMessage is the Verify of an email step: the provider's record
// must show messageID under key (notify.Sender.Confirm). Not sent
// contradicts; a pending index, a failed look-up or a nil sender is
// unverifiable.
func ConfirmMessage(ctx context.Context, s *notify.Sender, key effects.Key, messageID string) error {
	if s == nil {
		return Unverifiable("no SendGrid client to ask (SENDGRID_API_KEY is not set)")
	}
	err := s.Confirm(ctx, key, messageID)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, notify.ErrNotSent):
		return Contradicted("%v", err)
	}
	return Unverifiable("%v", err)
}
