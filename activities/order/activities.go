// Package order holds the order pipeline's keyed steps: Charge,
// MarkPaid, SendReceipt and, after a terminal charge failure, MarkFailed.
// Each is declared once (DeclCharge, ...) and runs through step.Keyed.Run,
// which claims its effect key before the effect.
package order

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/jackc/pgx/v5/pgxpool"
	stripeclient "github.com/stripe/stripe-go/v76/client"

	"github.com/keyedhq/keyed/effects"
	"github.com/keyedhq/keyed/notify"
	"github.com/keyedhq/keyed/orders"
	"github.com/keyedhq/keyed/step"
)

// Registered activity names.
const (
	NameCharge      = "Charge"
	NameMarkPaid    = "MarkPaid"
	NameSendReceipt = "SendReceipt"
	NameMarkFailed  = "MarkFailed"
)

// ReceiptTemplate is the notify template of the receipt email.
const ReceiptTemplate = "receipt"

// Deps is what the activities need. Every field is required except Logger.
type Deps struct {
	DB      *pgxpool.Pool
	Effects *effects.Client
	Orders  *orders.Store
	Stripe  *stripeclient.API
	Sender  *notify.Sender
	// Logger receives one record per step outcome. Nil means slog.Default().
	Logger *slog.Logger
}

// Activities implements the order pipeline's activities. A nil
// *Activities is only good for naming them in workflow.ExecuteActivity.
type Activities struct {
	run    step.Runner
	claims *effects.Client
	orders *orders.Store
	stripe *stripeclient.API
	sender *notify.Sender
	check  *checker
}

// New returns Activities over d. It returns an error naming the first
// missing dependency.
func New(d Deps) (*Activities, error) {
	switch {
	case d.DB == nil:
		return nil, errors.New("activities: New: DB is nil")
	case d.Effects == nil:
		return nil, errors.New("activities: New: Effects is nil")
	case d.Orders == nil:
		return nil, errors.New("activities: New: Orders is nil")
	case d.Stripe == nil || d.Stripe.PaymentIntents == nil:
		return nil, errors.New("activities: New: Stripe is nil")
	case d.Sender == nil:
		return nil, errors.New("activities: New: Sender is nil")
	}
	return &Activities{run: step.Runner{DB: d.DB, Effects: d.Effects, Logger: d.Logger}, claims: d.Effects,
		orders: d.Orders, stripe: d.Stripe, sender: d.Sender,
		check: &checker{CheckDeps{DB: d.DB, Orders: d.Orders, Stripe: d.Stripe, Sender: d.Sender}}}, nil
}

// call is one run of an order step.
type call = step.Call[orders.OrderInput]

// declare declares an order step whose outcome is T.
func declare[T any](d step.Declaration) step.Keyed[orders.OrderInput, T] {
	return step.Declare[orders.OrderInput, T](d)
}

// The order pipeline's steps, declared once.
var (
	DeclCharge      = declare[orders.ChargeResult](step.Declaration{Name: NameCharge, Class: effects.ClassExternalCreate, Step: orders.StepCharge})
	DeclMarkPaid    = declare[orders.MarkPaidResult](step.Declaration{Name: NameMarkPaid, Class: effects.ClassAbsoluteWrite, Step: orders.StepMarkPaid})
	DeclSendReceipt = declare[orders.ReceiptResult](step.Declaration{Name: NameSendReceipt, Class: effects.ClassIrreversibleSend,
		Step: orders.StepReceipt, Policy: notify.AtMostOnce})
	DeclMarkFailed = declare[orders.MarkFailedResult](step.Declaration{Name: NameMarkFailed, Class: effects.ClassAbsoluteWrite, Step: orders.StepMarkFailed})
)

// Definitions returns the order steps bound to a, each with the Verify of
// an operator's "done" outcome (see Checks). A nil a only names them.
func (a *Activities) Definitions() []step.Definition {
	defs := []step.Definition{
		DeclCharge.Bind(a.Charge),
		DeclMarkPaid.Bind(a.MarkPaid),
		DeclSendReceipt.Bind(a.SendReceipt),
		DeclMarkFailed.Bind(a.MarkFailed),
	}
	if a != nil {
		a.check.bind(defs)
	}
	return defs
}

// Declarations returns the order steps' declarations, in the order of
// Definitions.
func Declarations() []step.Declaration {
	var a *Activities
	defs := a.Definitions()
	out := make([]step.Declaration, len(defs))
	for i, d := range defs {
		out[i] = d.Declaration
	}
	return out
}

// loadOrder returns the order of c's input, or c's error for a missing one.
func (a *Activities) loadOrder(ctx context.Context, c *call) (*orders.Order, error) {
	o, err := a.orders.Get(ctx, c.In.TenantID, c.In.OrderID)
	if err != nil {
		return nil, fmt.Errorf("%s: load order: %w", c, err)
	}
	return o, nil
}
