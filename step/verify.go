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

// Evidence is what a provider shows about a waiting step's effect.
type Evidence struct {
	// Outcome, when not nil, is the step's outcome as the provider shows
	// it: the effect happened, and "done" with it settles the wait.
	Outcome any
	// Absent: the provider answered, past its index lag, and shows no
	// effect under the key; it did not happen, and "retry" settles the wait.
	Absent bool
	// Detail says what was seen, in one short line, for the audit.
	Detail string
}

// Gather asks a step's provider what became of its effect under key,
// changing nothing. An error means the evidence is not definitive (the
// look-up failed, the index may lag, what it shows does not match) and
// says why.
type Gather func(ctx context.Context, key effects.Key) (Evidence, error)

// GatherMessage is the Gather of an email step: the latest message
// SendGrid's Email Activity shows under key, as outcome(messageID) makes
// it the step's outcome; absent once the index has had its lag; otherwise
// notify.Sender.Find's error.
func GatherMessage(ctx context.Context, s *notify.Sender, key effects.Key, outcome func(messageID string) any) (Evidence, error) {
	if s == nil {
		return Evidence{}, errors.New("no SendGrid client to ask (SENDGRID_API_KEY is not set)")
	}
	id, err := s.Find(ctx, key)
	switch {
	case err == nil:
		return Evidence{Outcome: outcome(id), Detail: "SendGrid's Email Activity shows message " + id}, nil
	case errors.Is(err, notify.ErrNotSent):
		return Evidence{Absent: true, Detail: "SendGrid's Email Activity shows no message after its index lag"}, nil
	}
	return Evidence{}, err
}
