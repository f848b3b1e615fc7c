package refund

import (
	"context"
	"errors"

	"github.com/stripe/stripe-go/v76"

	ordersteps "github.com/keyedhq/keyed/activities/order"
	"github.com/keyedhq/keyed/activities/stripestep"
	"github.com/keyedhq/keyed/effects"
	"github.com/keyedhq/keyed/orders"
	"github.com/keyedhq/keyed/refunds"
	"github.com/keyedhq/keyed/step"
)

// checker holds the refund steps' Verify functions.
type checker struct {
	ordersteps.CheckDeps
	ledger *refunds.Ledger
}

func newChecker(d ordersteps.CheckDeps) (*checker, error) {
	if d.DB == nil || d.Orders == nil {
		return nil, errors.New("refunds: Checks: DB and Orders are required")
	}
	ledger, err := refunds.NewLedger(d.DB)
	if err != nil {
		return nil, err
	}
	return &checker{CheckDeps: d, ledger: ledger}, nil
}

// Checks returns the refund pipeline's declared steps (Declarations) as
// Definitions whose Verify checks an operator's "done" outcome, as
// Activities.Definitions' do, and whose Fn is nil: for a pipeline.Decider
// that applies decisions without running steps (starter resolve);
// step.Register refuses them. d is as for ordersteps.Checks: DB and
// Orders are required (an error otherwise), Stripe and Sender optional.
func Checks(d ordersteps.CheckDeps) ([]step.Definition, error) {
	c, err := newChecker(d)
	if err != nil {
		return nil, err
	}
	var defs []step.Definition
	for _, decl := range Declarations() {
		defs = append(defs, step.Definition{Declaration: decl})
	}
	c.bind(defs)
	return defs, nil
}

// bind sets each refund step's Verify in defs:
//
//   - refund_reserve: the refund's ledger row, under the effect key, for
//     the amount, in the order's currency;
//   - refund_stripe: Stripe's refund of that ID exists, is not failed or
//     canceled, for the ledger's amount, with the effect key in its
//     metadata, against the PaymentIntent whose metadata names the order's
//     charge; the confirmed refund is then recorded as RefundAtStripe
//     records it, so that MarkRefunded and the email count it;
//   - refund_mark: the order's transition under the effect key, to the
//     status given;
//   - refund_email: SendGrid's Email Activity shows the message ID under
//     the effect key;
//   - refund_release: the refund's release under the effect key, for that
//     amount and code.
func (c *checker) bind(defs []step.Definition) {
	verify := map[string]step.Verify{
		refunds.StepReserve: DeclReserve.Verifier(c.reserve),
		refunds.StepStripe:  DeclStripe.Verifier(c.stripe),
		refunds.StepMark: DeclMark.Verifier(func(ctx context.Context, key effects.Key, r refunds.MarkResult) error {
			in, err := inputOfKey(key)
			if err != nil {
				return err
			}
			return c.Orders.VerifyTransition(ctx, in.TenantID, in.OrderID, key, orders.Status(r.Status))
		}),
		refunds.StepEmail: DeclEmail.Verifier(func(ctx context.Context, key effects.Key, r refunds.EmailResult) error {
			return step.ConfirmMessage(ctx, c.Sender, key, r.MessageID)
		}),
		refunds.StepRelease: DeclRelease.Verifier(c.release),
	}
	for i := range defs {
		defs[i].Verify = verify[defs[i].Step]
	}
}

// entry returns the ledger row of key's refund.
func (c *checker) entry(ctx context.Context, key effects.Key) (refunds.RefundInput, *refunds.Entry, error) {
	in, err := inputOfKey(key)
	if err != nil {
		return in, nil, err
	}
	e, err := c.ledger.Get(ctx, in.TenantID, in.OrderID, in.RefundID)
	switch {
	case errors.Is(err, refunds.ErrNotFound):
		return in, nil, step.Contradicted("refund %s of order %s/%s is not in the ledger", in.RefundID, in.TenantID, in.OrderID)
	case err != nil:
		return in, nil, step.Unverifiable("read the refund ledger: %v", err)
	}
	return in, e, nil
}

// reserve checks a reserve's outcome against the ledger and the order.
func (c *checker) reserve(ctx context.Context, key effects.Key, r refunds.ReserveResult) error {
	in, e, err := c.entry(ctx, key)
	if err != nil {
		return err
	}
	o, err := c.Orders.Get(ctx, in.TenantID, in.OrderID)
	switch {
	case err != nil:
		return step.Unverifiable("load the order: %v", err)
	case e.EffectKey != key.String():
		return step.Contradicted("refund %s's ledger row was reserved under %s, not %s", in.RefundID, e.EffectKey, key)
	case e.AmountMinor != r.AmountMinor || o.Currency != r.Currency:
		return step.Contradicted("the ledger reserved %s, the result says %s",
			orders.FormatAmount(e.AmountMinor, o.Currency), orders.FormatAmount(r.AmountMinor, r.Currency))
	}
	return nil
}

// stripe checks a refund's outcome against the ledger and Stripe, and
// records it as RefundAtStripe does once Stripe confirms it.
func (c *checker) stripe(ctx context.Context, key effects.Key, r refunds.StripeResult) error {
	in, e, err := c.entry(ctx, key)
	if err != nil {
		return err
	}
	rel, err := c.released(ctx, in)
	switch {
	case err != nil:
		return err
	case rel != nil:
		return step.Contradicted("refund %s was released after Stripe refused it (%s)", in.RefundID, rel.Code)
	case r.AmountMinor != e.AmountMinor:
		return step.Contradicted("the ledger reserved %d, the result says %d", e.AmountMinor, r.AmountMinor)
	case c.Stripe == nil:
		return step.Unverifiable("no Stripe client to ask (STRIPE_SECRET_KEY is not set)")
	}
	params := &stripe.RefundParams{}
	params.Context = ctx
	re, err := c.Stripe.Refunds.Get(r.RefundID, params)
	if err != nil {
		return stripestep.LookupError("refund "+r.RefundID, err)
	}
	if err := refundMismatch(re, key, e, r); err != nil {
		return err
	}
	if err := c.chargedUnder(ctx, in, r.PaymentIntentID); err != nil {
		return err
	}
	confirmed := r
	confirmed.Status = string(re.Status)
	if err := c.ledger.RecordStripe(ctx, e, confirmed, key.String()); err != nil {
		return step.Unverifiable("record the confirmed refund: %v", err)
	}
	return nil
}

// refundMismatch returns a contradiction when Stripe's refund re is not the
// refund r of the ledger row e under key.
func refundMismatch(re *stripe.Refund, key effects.Key, e *refunds.Entry, r refunds.StripeResult) error {
	pi := ""
	if re.PaymentIntent != nil {
		pi = re.PaymentIntent.ID
	}
	switch got := re.Metadata[stripestep.MetadataEffectKey]; {
	case got != key.String():
		return step.Contradicted("Stripe's refund %s carries the effect key %q, not %s", re.ID, got, key)
	case re.Status == stripe.RefundStatusFailed || re.Status == stripe.RefundStatusCanceled:
		return step.Contradicted("Stripe's refund %s is %s", re.ID, re.Status)
	case re.Amount != e.AmountMinor || string(re.Currency) != r.Currency:
		return step.Contradicted("Stripe's refund %s is for %s, the ledger's for %s", re.ID,
			orders.FormatAmount(re.Amount, string(re.Currency)), orders.FormatAmount(e.AmountMinor, r.Currency))
	case pi != r.PaymentIntentID:
		return step.Contradicted("Stripe's refund %s is of PaymentIntent %q, not %s", re.ID, pi, r.PaymentIntentID)
	}
	return nil
}

// chargedUnder checks that the PaymentIntent paymentIntentID is the
// charge of in's order: its metadata carries the order's charge key.
func (c *checker) chargedUnder(ctx context.Context, in refunds.RefundInput, paymentIntentID string) error {
	chargeKey, err := orders.NewOrderInput(in.TenantID, in.OrderID).EffectKey(orders.StepCharge)
	if err != nil {
		return step.Contradicted("%v", err)
	}
	params := &stripe.PaymentIntentParams{}
	params.Context = ctx
	pi, err := c.Stripe.PaymentIntents.Get(paymentIntentID, params)
	if err != nil {
		return stripestep.LookupError("PaymentIntent "+paymentIntentID, err)
	}
	if got := pi.Metadata[stripestep.MetadataEffectKey]; got != chargeKey.String() {
		return step.Contradicted("Stripe's PaymentIntent %s is not order %s/%s's charge (its effect key is %q, not %s)",
			pi.ID, in.TenantID, in.OrderID, got, chargeKey)
	}
	return nil
}

// released returns in's release, nil when there is none, or an
// unverifiable error when the ledger cannot be read.
func (c *checker) released(ctx context.Context, in refunds.RefundInput) (*refunds.Release, error) {
	rel, err := c.ledger.Released(ctx, in.TenantID, in.OrderID, in.RefundID)
	if err != nil {
		return nil, step.Unverifiable("read the refund's releases: %v", err)
	}
	return rel, nil
}

// release checks a release's outcome against the ledger's releases.
func (c *checker) release(ctx context.Context, key effects.Key, r refunds.ReleaseResult) error {
	in, err := inputOfKey(key)
	if err != nil {
		return err
	}
	rel, err := c.released(ctx, in)
	switch {
	case err != nil:
		return err
	case rel == nil:
		return step.Contradicted("refund %s of order %s/%s was never released", in.RefundID, in.TenantID, in.OrderID)
	case rel.EffectKey != key.String():
		return step.Contradicted("refund %s was released under %s, not %s", in.RefundID, rel.EffectKey, key)
	case rel.AmountMinor != r.AmountMinor || rel.Code != r.Code:
		return step.Contradicted("refund %s was released for %d (%s), the result says %d (%s)",
			in.RefundID, rel.AmountMinor, rel.Code, r.AmountMinor, r.Code)
	}
	return nil
}

// inputOfKey returns the refund (its IDs, without amount or reason) whose
// step's effect key is key.
func inputOfKey(key effects.Key) (refunds.RefundInput, error) {
	in, _, ok := refunds.RefundOfKey(key)
	if !ok {
		return in, step.Contradicted("%s is not a refund step's effect key", key)
	}
	return in, nil
}
