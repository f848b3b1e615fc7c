package order

import (
	"context"
	"errors"

	"github.com/stripe/stripe-go/v76"

	"github.com/keyedhq/keyed/activities/stripestep"
	"github.com/keyedhq/keyed/effects"
	"github.com/keyedhq/keyed/orders"
	"github.com/keyedhq/keyed/step"
)

// verifyCharge checks a charge's outcome against the order and Stripe:
// the PaymentIntent exists, succeeded, for the order's amount, under the key.
func (a *Activities) verifyCharge(ctx context.Context, key effects.Key, r orders.ChargeResult) error {
	tenant, id, err := orderOfKey(key)
	if err != nil {
		return err
	}
	o, err := a.orders.Get(ctx, tenant, id)
	switch {
	case errors.Is(err, orders.ErrNotFound):
		return step.Contradicted("tenant %s has no order %s", tenant, id)
	case err != nil:
		return step.Unverifiable("load the order: %v", err)
	case r.AmountMinor != o.AmountMinor || r.Currency != o.Currency:
		return step.Contradicted("the result is for %s, the order for %s", orders.FormatAmount(r.AmountMinor, r.Currency), orders.FormatAmount(o.AmountMinor, o.Currency))
	case a.stripe == nil:
		return step.Unverifiable("no Stripe client to ask (STRIPE_SECRET_KEY is not set)")
	}
	params := &stripe.PaymentIntentParams{}
	params.Context = ctx
	pi, err := a.stripe.PaymentIntents.Get(r.PaymentIntentID, params)
	if err != nil {
		return stripestep.LookupError("PaymentIntent "+r.PaymentIntentID, err)
	}
	if _, problem := stripestep.IntentMismatch(pi, key, o.AmountMinor, o.Currency); problem != "" {
		return step.Contradicted("Stripe's PaymentIntent %s %s", pi.ID, problem)
	}
	return nil
}

// verifyTransition checks that the order of key moved to want under key.
func (a *Activities) verifyTransition(ctx context.Context, key effects.Key, want orders.Status) error {
	tenant, id, err := orderOfKey(key)
	if err != nil {
		return err
	}
	return a.orders.VerifyTransition(ctx, tenant, id, key, want)
}

// orderOfKey returns the tenant and order of an order step's key.
func orderOfKey(key effects.Key) (tenant, id string, err error) {
	parts := key.Parts()
	if len(parts) != 3 || parts[0] != "order" {
		return "", "", step.Contradicted("%s is not an order step's effect key", key)
	}
	return key.Tenant(), parts[1], nil
}
