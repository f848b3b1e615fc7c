// Package order holds the order pipeline's keyed steps: Charge, MarkPaid,
// SendReceipt and, after a terminal charge failure, MarkFailed. Each is
// declared once (DeclCharge, ...) and runs through step.Keyed.Run.
package order

import (
	"context"
	"fmt"
	"slices"

	stripeclient "github.com/stripe/stripe-go/v76/client"

	"github.com/keyedhq/keyed/activities/stripestep"
	"github.com/keyedhq/keyed/effects"
	"github.com/keyedhq/keyed/notify"
	"github.com/keyedhq/keyed/orders"
	"github.com/keyedhq/keyed/pipeline"
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

// call is one run of an order step.
type call = step.Call[orders.OrderInput]

// declare declares an order step whose outcome is T.
func declare[T any](d step.Declaration) step.Keyed[orders.OrderInput, T] {
	return step.Declare[orders.OrderInput, T](d)
}

// The order pipeline's steps, declared once.
var (
	DeclCharge = declare[orders.ChargeResult](step.Declaration{Name: NameCharge, Class: effects.ClassExternalCreate, Step: orders.StepCharge,
		Provider: stripestep.Provider, Keep: step.KeepMoney})
	DeclMarkPaid = declare[orders.MarkPaidResult](step.Declaration{Name: NameMarkPaid, Class: effects.ClassAbsoluteWrite, Step: orders.StepMarkPaid,
		Local: true, SelfGuarded: true})
	DeclSendReceipt = declare[orders.ReceiptResult](step.Declaration{Name: NameSendReceipt, Class: effects.ClassIrreversibleSend,
		Step: orders.StepReceipt, Policy: notify.AtMostOnce, Provider: notify.Provider})
	DeclMarkFailed = declare[orders.MarkFailedResult](step.Declaration{Name: NameMarkFailed, Class: effects.ClassAbsoluteWrite, Step: orders.StepMarkFailed})
)

// Declarations returns the order steps' declarations, in the order of
// Definitions.
func Declarations() []step.Declaration {
	return []step.Declaration{DeclCharge.Declaration, DeclMarkPaid.Declaration, DeclSendReceipt.Declaration, DeclMarkFailed.Declaration}
}

// PaidPath returns the declarations of the steps a paid order takes:
// every order step but MarkFailed, which only a declined order takes.
func PaidPath() []step.Declaration {
	return slices.DeleteFunc(Declarations(), func(d step.Declaration) bool { return d.Name == NameMarkFailed })
}

// Activities implements the order steps over a pipeline.Deps.
type Activities struct {
	run    step.Runner
	claims *effects.Client
	orders *orders.Store
	stripe *stripeclient.API
	sender *notify.Sender
}

// New returns the order steps over d: the Stripe client and the receipt's
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
	}
	return a, nil
}

// Definitions returns the order steps bound to a, each with the Verify of
// an operator's "done" outcome, in the order of Declarations.
func (a *Activities) Definitions() []step.Definition {
	charge := DeclCharge.Define(a.Charge, a.verifyCharge)
	charge.Gather = a.gatherCharge
	receipt := DeclSendReceipt.Define(a.SendReceipt, func(ctx context.Context, key effects.Key, r orders.ReceiptResult) error {
		return step.ConfirmMessage(ctx, a.sender, key, r.MessageID)
	})
	receipt.Gather = func(ctx context.Context, key effects.Key) (step.Evidence, error) {
		return step.GatherMessage(ctx, a.sender, key, func(id string) any { return orders.ReceiptResult{MessageID: id} })
	}
	return []step.Definition{
		charge,
		DeclMarkPaid.Define(a.MarkPaid, func(ctx context.Context, key effects.Key, _ orders.MarkPaidResult) error {
			return a.verifyTransition(ctx, key, orders.StatusPaid)
		}),
		receipt,
		DeclMarkFailed.Define(a.MarkFailed, func(ctx context.Context, key effects.Key, _ orders.MarkFailedResult) error {
			return a.verifyTransition(ctx, key, orders.StatusFailed)
		}),
	}
}

// loadOrder returns the order of c's input, or c's error for a missing one.
func (a *Activities) loadOrder(ctx context.Context, c *call) (*orders.Order, error) {
	if a.orders == nil {
		return nil, c.Fail(step.ErrTypeTerminal, "the worker has no database")
	}
	o, err := a.orders.Get(ctx, c.In.TenantID, c.In.OrderID)
	if err != nil {
		return nil, fmt.Errorf("%s: load order: %w", c, err)
	}
	return o, nil
}
