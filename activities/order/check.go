package order

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stripe/stripe-go/v76"
	stripeclient "github.com/stripe/stripe-go/v76/client"

	"github.com/keyedhq/keyed/activities/stripestep"
	"github.com/keyedhq/keyed/effects"
	"github.com/keyedhq/keyed/notify"
	"github.com/keyedhq/keyed/orders"
	"github.com/keyedhq/keyed/step"
)

// CheckDeps is what the checks of operators' "done" outcomes of a
// pipeline's steps need (Checks, and the refund steps'). DB and Orders are
// required: the writes' checks read the order's transitions and ledger,
// the charge's its amount. Stripe and Sender are optional: a check that
// must ask one that is nil finds the record unverifiable, saying which
// setting is missing.
type CheckDeps struct {
	DB     *pgxpool.Pool
	Orders *orders.Store
	Stripe *stripeclient.API
	Sender *notify.Sender
}

// checker holds the order steps' Verify functions.
type checker struct{ CheckDeps }

// Checks returns the order pipeline's declared steps (Declarations) as
// Definitions whose Verify checks an operator's "done" outcome, as
// Activities.Definitions' do, and whose Fn is nil: for a pipeline.Decider
// that applies decisions without running steps (starter resolve).
// activities.Register refuses them. It returns an error if d.DB or
// d.Orders is nil.
func Checks(d CheckDeps) ([]step.Definition, error) {
	if d.DB == nil || d.Orders == nil {
		return nil, errors.New("activities: Checks: DB and Orders are required")
	}
	var defs []step.Definition
	for _, decl := range Declarations() {
		defs = append(defs, step.Definition{Declaration: decl})
	}
	(&checker{d}).bind(defs)
	return defs, nil
}

// bind sets each order step's Verify in defs:
//
//   - charge: the order's amount and currency, then Stripe's PaymentIntent
//     of that ID: it exists, succeeded, for that amount and currency, with
//     the effect key in its metadata;
//   - mark_paid, mark_failed: the order's transition recorded under the
//     effect key, to paid or failed;
//   - receipt: SendGrid's Email Activity shows the message ID under the
//     effect key (notify.Sender.Confirm).
func (c *checker) bind(defs []step.Definition) {
	verify := map[string]step.Verify{
		orders.StepCharge: DeclCharge.Verifier(c.charge),
		orders.StepMarkPaid: DeclMarkPaid.Verifier(func(ctx context.Context, key effects.Key, _ orders.MarkPaidResult) error {
			return c.transition(ctx, key, orders.StatusPaid)
		}),
		orders.StepMarkFailed: DeclMarkFailed.Verifier(func(ctx context.Context, key effects.Key, _ orders.MarkFailedResult) error {
			return c.transition(ctx, key, orders.StatusFailed)
		}),
		orders.StepReceipt: DeclSendReceipt.Verifier(func(ctx context.Context, key effects.Key, r orders.ReceiptResult) error {
			return step.ConfirmMessage(ctx, c.Sender, key, r.MessageID)
		}),
	}
	for i := range defs {
		defs[i].Verify = verify[defs[i].Step]
	}
}

// charge checks a charge's outcome against the order and Stripe.
func (c *checker) charge(ctx context.Context, key effects.Key, r orders.ChargeResult) error {
	tenant, id, err := orderOfKey(key)
	if err != nil {
		return err
	}
	o, err := c.Orders.Get(ctx, tenant, id)
	switch {
	case errors.Is(err, orders.ErrNotFound):
		return step.Contradicted("tenant %s has no order %s", tenant, id)
	case err != nil:
		return step.Unverifiable("load the order: %v", err)
	case r.AmountMinor != o.AmountMinor || r.Currency != o.Currency:
		return step.Contradicted("the result is for %s, the order for %s", orders.FormatAmount(r.AmountMinor, r.Currency), orders.FormatAmount(o.AmountMinor, o.Currency))
	case c.Stripe == nil:
		return step.Unverifiable("no Stripe client to ask (STRIPE_SECRET_KEY is not set)")
	}
	params := &stripe.PaymentIntentParams{}
	params.Context = ctx
	pi, err := c.Stripe.PaymentIntents.Get(r.PaymentIntentID, params)
	if err != nil {
		return stripestep.LookupError("PaymentIntent "+r.PaymentIntentID, err)
	}
	if _, problem := stripestep.IntentMismatch(pi, key, o.AmountMinor, o.Currency); problem != "" {
		return step.Contradicted("Stripe's PaymentIntent %s %s", pi.ID, problem)
	}
	return nil
}

// transition checks that the order of key moved to want under key, as the
// step records it.
func (c *checker) transition(ctx context.Context, key effects.Key, want orders.Status) error {
	tenant, id, err := orderOfKey(key)
	if err != nil {
		return err
	}
	return c.Orders.VerifyTransition(ctx, tenant, id, key, want)
}

// orderOfKey returns the tenant and order of an order step's key.
func orderOfKey(key effects.Key) (tenant, id string, err error) {
	parts := key.Parts()
	if len(parts) != 3 || parts[0] != "order" {
		return "", "", step.Contradicted("%s is not an order step's effect key", key)
	}
	return key.Tenant(), parts[1], nil
}
