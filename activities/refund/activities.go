// Package refund holds the refund pipeline's keyed steps: Reserve,
// RefundAtStripe, MarkRefunded, SendRefundEmail and, after Stripe refused
// a refund for good, ReleaseRefund. Each is declared once and runs through
// step.Keyed.Run.
package refund

import (
	"context"
	"errors"
	"log/slog"

	"github.com/jackc/pgx/v5/pgxpool"
	stripeclient "github.com/stripe/stripe-go/v76/client"

	ordersteps "github.com/keyedhq/keyed/activities/order"
	"github.com/keyedhq/keyed/effects"
	"github.com/keyedhq/keyed/notify"
	"github.com/keyedhq/keyed/orders"
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

// EmailTemplate is the notify template of the refund email. Its delivery
// policy is the Sender's for this template (notify.SenderOpts.Policies), at
// most once unless configured otherwise.
const EmailTemplate = "refund"

// The refund workflow's activities, declared once: names, effect classes,
// key steps, the rule for an operator's "done" outcome (from the outcome
// type) and, for the email, its delivery policy. The workflow takes
// each step's Temporal options from its declaration.
var (
	DeclReserve = step.Declare[refunds.RefundInput, refunds.ReserveResult](step.Declaration{Name: NameReserve,
		Class: effects.ClassAbsoluteWrite, Step: refunds.StepReserve})
	DeclStripe = step.Declare[refunds.RefundInput, refunds.StripeResult](step.Declaration{Name: NameRefundAtStripe,
		Class: effects.ClassExternalCreate, Step: refunds.StepStripe})
	DeclMark = step.Declare[refunds.RefundInput, refunds.MarkResult](step.Declaration{Name: NameMarkRefunded,
		Class: effects.ClassAbsoluteWrite, Step: refunds.StepMark})
	DeclEmail = step.Declare[refunds.RefundInput, refunds.EmailResult](step.Declaration{Name: NameSendRefundEmail,
		Class: effects.ClassIrreversibleSend, Step: refunds.StepEmail, Policy: notify.AtMostOnce})
	DeclRelease = step.Declare[refunds.RefundInput, refunds.ReleaseResult](step.Declaration{Name: NameReleaseRefund,
		Class: effects.ClassAbsoluteWrite, Step: refunds.StepRelease})
)

// Declarations returns the declarations of the refund activities, in the
// order of Definitions: the four steps every run shows, then the release,
// which runs only after Stripe refused the refund.
func Declarations() []step.Declaration {
	return append(steps(), DeclRelease.Declaration)
}

// LongestPath returns the declarations of the steps on a refund run's
// longest path, for orderflow.LongestRun: Reserve, RefundAtStripe,
// MarkRefunded and SendRefundEmail, the steps a run shows from its start.
// ReleaseRefund runs instead of the last two, and retries for no longer
// than they do together.
func LongestPath() []step.Declaration {
	return steps()
}

// steps returns the declarations of the steps a refund run shows from its
// start.
func steps() []step.Declaration {
	return []step.Declaration{DeclReserve.Declaration, DeclStripe.Declaration, DeclMark.Declaration, DeclEmail.Declaration}
}

// call and effect are activities' keyed-activity helpers for a
// RefundInput.
type (
	call          = step.Call[refunds.RefundInput]
	effect[T any] = step.Effect[refunds.RefundInput, T]
)

// Deps is what the refund activities need. Every field is required except
// Logger. Stripe must have its PaymentIntents and Refunds clients (as
// stripestep.NewClient's has).
type Deps struct {
	DB      *pgxpool.Pool
	Effects *effects.Client
	Orders  *orders.Store
	Stripe  *stripeclient.API
	Sender  *notify.Sender
	// Logger receives one record per step outcome. Nil means slog.Default().
	Logger *slog.Logger
}

// Activities implements the refund workflow's activities. A nil
// *Activities is only good for naming them.
type Activities struct {
	run    step.Runner
	claims *effects.Client
	orders *orders.Store
	ledger *refunds.Ledger
	stripe *stripeclient.API
	sender *notify.Sender
	check  *checker
}

// New returns Activities over d. It returns an error naming the first
// missing dependency.
func New(d Deps) (*Activities, error) {
	switch {
	case d.DB == nil:
		return nil, errors.New("refunds: New: DB is nil")
	case d.Effects == nil:
		return nil, errors.New("refunds: New: Effects is nil")
	case d.Orders == nil:
		return nil, errors.New("refunds: New: Orders is nil")
	case d.Stripe == nil || d.Stripe.Refunds == nil:
		return nil, errors.New("refunds: New: Stripe is nil or has no Refunds client")
	case d.Sender == nil:
		return nil, errors.New("refunds: New: Sender is nil")
	}
	check, err := newChecker(ordersteps.CheckDeps{DB: d.DB, Orders: d.Orders, Stripe: d.Stripe, Sender: d.Sender})
	if err != nil {
		return nil, err
	}
	return &Activities{run: step.Runner{DB: d.DB, Effects: d.Effects, Logger: d.Logger}, claims: d.Effects, orders: d.Orders,
		ledger: check.ledger, stripe: d.Stripe, sender: d.Sender, check: check}, nil
}

// Definitions returns the refund activities bound to a, for
// step.Register, each with the Verify of an operator's "done"
// outcome (see Checks) for pipeline.NewDecider. A nil a is good for naming
// them, and verifies nothing.
func (a *Activities) Definitions() []step.Definition {
	defs := []step.Definition{
		DeclReserve.Bind(a.Reserve),
		DeclStripe.Bind(a.RefundAtStripe),
		DeclMark.Bind(a.MarkRefunded),
		DeclEmail.Bind(a.SendRefundEmail),
		DeclRelease.Bind(a.ReleaseRefund),
	}
	if a != nil {
		a.check.bind(defs)
	}
	return defs
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
