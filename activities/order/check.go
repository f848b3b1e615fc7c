package order

import (
	"context"
	"errors"
	"fmt"
	"time"

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

// stripeSearchLag is how long Stripe's search may take to show a new
// PaymentIntent: no charge is proven absent before it has passed.
const stripeSearchLag = 2 * time.Minute

// gatherCharge is the charge's step.Gather: a succeeded PaymentIntent for
// the order's amount under the key settles it done; none under the key,
// once Stripe's search has had its lag since the record last changed,
// proves it absent. Anything else is left for a person.
func (a *Activities) gatherCharge(ctx context.Context, key effects.Key) (step.Evidence, error) {
	tenant, id, err := orderOfKey(key)
	if err != nil {
		return step.Evidence{}, err
	}
	if a.stripe == nil || a.orders == nil {
		return step.Evidence{}, errors.New("no Stripe client or database to ask")
	}
	o, err := a.orders.Get(ctx, tenant, id)
	if err != nil {
		return step.Evidence{}, fmt.Errorf("load the order: %w", err)
	}
	var other string
	pi, err := stripestep.FindCharge(ctx, a.stripe, key, func(pi *stripe.PaymentIntent) (bool, error) {
		m, problem := stripestep.IntentMismatch(pi, key, o.AmountMinor, o.Currency)
		if m != stripestep.Matches {
			other = "Stripe's PaymentIntent " + pi.ID + " under the key " + problem
		}
		return m == stripestep.Matches, nil
	})
	switch {
	case err != nil:
		return step.Evidence{}, err
	case pi != nil:
		return step.Evidence{Outcome: stripestep.ChargeResult(pi),
			Detail: "Stripe shows PaymentIntent " + pi.ID + " succeeded for " + orders.FormatAmount(pi.Amount, string(pi.Currency))}, nil
	case other != "":
		return step.Evidence{}, errors.New(other)
	}
	rec, err := a.claims.Get(ctx, key)
	if err != nil {
		return step.Evidence{}, fmt.Errorf("read the effect record: %w", err)
	}
	if since := time.Since(rec.UpdatedAt); since < stripeSearchLag {
		return step.Evidence{}, fmt.Errorf("no PaymentIntent under the key in Stripe's search yet; it may lag %s", stripeSearchLag)
	}
	return step.Evidence{Absent: true, Detail: "Stripe's search shows no PaymentIntent under the key after its index lag"}, nil
}
