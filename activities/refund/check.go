package refund

import (
	"context"
	"errors"

	"github.com/stripe/stripe-go/v76"

	"github.com/keyedhq/keyed/activities/stripestep"
	"github.com/keyedhq/keyed/effects"
	"github.com/keyedhq/keyed/orders"
	"github.com/keyedhq/keyed/refunds"
	"github.com/keyedhq/keyed/step"
)

// keyEntry returns the ledger row of key's refund.
func (a *Activities) keyEntry(ctx context.Context, key effects.Key) (refunds.RefundInput, *refunds.Entry, error) {
	in, err := inputOfKey(key)
	if err != nil {
		return in, nil, err
	}
	e, err := a.ledger.Get(ctx, in.TenantID, in.OrderID, in.RefundID)
	switch {
	case errors.Is(err, refunds.ErrNotFound):
		return in, nil, step.Contradicted("refund %s of order %s/%s is not in the ledger", in.RefundID, in.TenantID, in.OrderID)
	case err != nil:
		return in, nil, step.Unverifiable("read the refund ledger: %v", err)
	}
	return in, e, nil
}

// verifyReserve checks a reserve's outcome against the ledger and the order.
func (a *Activities) verifyReserve(ctx context.Context, key effects.Key, r refunds.ReserveResult) error {
	in, e, err := a.keyEntry(ctx, key)
	if err != nil {
		return err
	}
	o, err := a.orders.Get(ctx, in.TenantID, in.OrderID)
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

// verifyStripe checks a refund's outcome against the ledger and Stripe, and
// records it as RefundAtStripe does once Stripe confirms it.
func (a *Activities) verifyStripe(ctx context.Context, key effects.Key, r refunds.StripeResult) error {
	in, e, err := a.keyEntry(ctx, key)
	if err != nil {
		return err
	}
	rel, err := a.releasedOf(ctx, in)
	switch {
	case err != nil:
		return err
	case rel != nil:
		return step.Contradicted("refund %s was released after Stripe refused it (%s)", in.RefundID, rel.Code)
	case r.AmountMinor != e.AmountMinor:
		return step.Contradicted("the ledger reserved %d, the result says %d", e.AmountMinor, r.AmountMinor)
	case a.stripe == nil:
		return step.Unverifiable("no Stripe client to ask (STRIPE_SECRET_KEY is not set)")
	}
	params := &stripe.RefundParams{}
	params.Context = ctx
	re, err := a.stripe.Refunds.Get(r.RefundID, params)
	if err != nil {
		return stripestep.LookupError("refund "+r.RefundID, err)
	}
	if err := refundMismatch(re, key, e, r); err != nil {
		return err
	}
	if err := a.chargedUnder(ctx, in, r.PaymentIntentID); err != nil {
		return err
	}
	confirmed := r
	confirmed.Status = string(re.Status)
	if err := a.ledger.RecordStripe(ctx, e, confirmed, key.String()); err != nil {
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
func (a *Activities) chargedUnder(ctx context.Context, in refunds.RefundInput, paymentIntentID string) error {
	chargeKey, err := orders.NewOrderInput(in.TenantID, in.OrderID).EffectKey(orders.StepCharge)
	if err != nil {
		return step.Contradicted("%v", err)
	}
	params := &stripe.PaymentIntentParams{}
	params.Context = ctx
	pi, err := a.stripe.PaymentIntents.Get(paymentIntentID, params)
	if err != nil {
		return stripestep.LookupError("PaymentIntent "+paymentIntentID, err)
	}
	if got := pi.Metadata[stripestep.MetadataEffectKey]; got != chargeKey.String() {
		return step.Contradicted("Stripe's PaymentIntent %s is not order %s/%s's charge (its effect key is %q, not %s)",
			pi.ID, in.TenantID, in.OrderID, got, chargeKey)
	}
	return nil
}

// releasedOf returns in's release, nil when there is none, or an
// unverifiable error when the ledger cannot be read.
func (a *Activities) releasedOf(ctx context.Context, in refunds.RefundInput) (*refunds.Release, error) {
	rel, err := a.ledger.Released(ctx, in.TenantID, in.OrderID, in.RefundID)
	if err != nil {
		return nil, step.Unverifiable("read the refund's releases: %v", err)
	}
	return rel, nil
}

// verifyRelease checks a release's outcome against the ledger's releases.
func (a *Activities) verifyRelease(ctx context.Context, key effects.Key, r refunds.ReleaseResult) error {
	in, err := inputOfKey(key)
	if err != nil {
		return err
	}
	rel, err := a.releasedOf(ctx, in)
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
