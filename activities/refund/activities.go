// Package refund holds the refund pipeline's keyed steps: Reserve,
// RefundAtStripe, MarkRefunded, SendRefundEmail and, after Stripe refused
// a refund for good, ReleaseRefund. Each is declared once and runs through
// step.Keyed.Run.
package refund

import (
	"context"
	"errors"

	stripeclient "github.com/stripe/stripe-go/v76/client"

	"github.com/keyedhq/keyed/activities/stripestep"
	"github.com/keyedhq/keyed/effects"
	"github.com/keyedhq/keyed/notify"
	"github.com/keyedhq/keyed/orders"
	"github.com/keyedhq/keyed/pipeline"
	"github.com/keyedhq/keyed/refunds"
	"github.com/keyedhq/keyed/step"
)

// Registered activity names.
const (
	NameReserve         = "RefundReserve"
	NameRefundAtStripe  = "RefundAtStripe"
	NameMarkRefunded    = "MarkRefunded"
	NameSendRefundEmail = "SendRefundEmail"
	NameReleaseRefund   = "ReleaseRefund"
)

// EmailTemplate is the notify template of the refund email.
const EmailTemplate = "refund"

// The refund pipeline's steps, declared once.
var (
	DeclReserve = step.Declare[refunds.RefundInput, refunds.ReserveResult](step.Declaration{Name: NameReserve,
		Class: effects.ClassAbsoluteWrite, Step: refunds.StepReserve})
	DeclStripe = step.Declare[refunds.RefundInput, refunds.StripeResult](step.Declaration{Name: NameRefundAtStripe,
		Class: effects.ClassExternalCreate, Step: refunds.StepStripe, Provider: stripestep.Provider, Keep: step.KeepMoney})
	DeclMark = step.Declare[refunds.RefundInput, refunds.MarkResult](step.Declaration{Name: NameMarkRefunded,
		Class: effects.ClassAbsoluteWrite, Step: refunds.StepMark})
	DeclEmail = step.Declare[refunds.RefundInput, refunds.EmailResult](step.Declaration{Name: NameSendRefundEmail,
		Class: effects.ClassIrreversibleSend, Step: refunds.StepEmail, Policy: notify.AtMostOnce, Provider: notify.Provider})
	DeclRelease = step.Declare[refunds.RefundInput, refunds.ReleaseResult](step.Declaration{Name: NameReleaseRefund,
		Class: effects.ClassAbsoluteWrite, Step: refunds.StepRelease})
)

// Declarations returns the refund steps' declarations, in the order of
// Definitions: the four every run shows, then the release.
func Declarations() []step.Declaration {
	return append(LongestPath(), DeclRelease.Declaration)
}

// LongestPath returns the steps a refund run shows from its start, its
// longest path: ReleaseRefund runs instead of the last two, and retries for
// no longer than they do together.
func LongestPath() []step.Declaration {
	return []step.Declaration{DeclReserve.Declaration, DeclStripe.Declaration, DeclMark.Declaration, DeclEmail.Declaration}
}

// call and effect are a refund step's run and effect.
type (
	call          = step.Call[refunds.RefundInput]
	effect[T any] = step.Effect[refunds.RefundInput, T]
)

// Activities implements the refund steps over a pipeline.Deps.
type Activities struct {
	run    step.Runner
	claims *effects.Client
	orders *orders.Store
	ledger *refunds.Ledger
	stripe *stripeclient.API
	sender *notify.Sender
}

// New returns the refund steps over d: the Stripe client and the email's
// notify.Sender are d's providers. A step whose provider d lacks fails
// terminally when it runs, and its check finds the record unverifiable.
func New(d pipeline.Deps) (*Activities, error) {
	a := &Activities{run: d.Runner(), claims: d.Effects}
	a.stripe, _ = pipeline.Provider[*stripeclient.API](d)
	a.sender, _ = pipeline.Provider[*notify.Sender](d)
	if d.DB != nil {
		var err error
		if a.orders, err = orders.NewStore(d.DB); err != nil {
			return nil, err
		}
		if a.ledger, err = refunds.NewLedger(d.DB); err != nil {
			return nil, err
		}
	}
	return a, nil
}

// Definitions returns the refund steps bound to a, each with the Verify of
// an operator's "done" outcome, in the order of Declarations.
func (a *Activities) Definitions() []step.Definition {
	email := DeclEmail.Define(a.SendRefundEmail, func(ctx context.Context, key effects.Key, r refunds.EmailResult) error {
		return step.ConfirmMessage(ctx, a.sender, key, r.MessageID)
	})
	email.Gather = func(ctx context.Context, key effects.Key) (step.Evidence, error) {
		return step.GatherMessage(ctx, a.sender, key, func(id string) any { return refunds.EmailResult{MessageID: id} })
	}
	return []step.Definition{
		DeclReserve.Define(a.Reserve, a.verifyReserve),
		DeclStripe.Define(a.RefundAtStripe, a.verifyStripe),
		DeclMark.Define(a.MarkRefunded, func(ctx context.Context, key effects.Key, r refunds.MarkResult) error {
			in, err := inputOfKey(key)
			if err != nil {
				return err
			}
			return a.orders.VerifyTransition(ctx, in.TenantID, in.OrderID, key, orders.Status(r.Status))
		}),
		email,
		DeclRelease.Define(a.ReleaseRefund, a.verifyRelease),
	}
}

// entry returns the refund's ledger row, or an InvalidState error when it
// was not reserved.
func (a *Activities) entry(ctx context.Context, c *call) (*refunds.Entry, error) {
	e, err := a.ledger.Get(ctx, c.In.TenantID, c.In.OrderID, c.In.RefundID)
	if errors.Is(err, refunds.ErrNotFound) {
		return nil, c.Fail(step.ErrTypeInvalidState, "refund %s is not in the ledger; Reserve must run first", c.In.RefundID)
	}
	return e, err
}
