package order

import (
	"context"
	"strconv"
	"time"

	"github.com/stripe/stripe-go/v76"

	"github.com/keyedhq/keyed/activities/stripestep"
	"github.com/keyedhq/keyed/effects"
	"github.com/keyedhq/keyed/orders"
	"github.com/keyedhq/keyed/step"
)

// Charge charges the order's payment method for its amount, once.
//
// Effect class: external create. The effect key goes to Stripe as the
// PaymentIntent's Idempotency-Key and metadata effect_key; an attempt after
// an earlier one (or on an old order) first searches Stripe by that
// metadata, since Stripe forgets keys after 24 hours.
//
// Errors: InvalidInput, OrderNotFound, InvalidState (the order is not
// pending), CardDeclined, PaymentIncomplete, KeyReused, ProviderRejected
// and Terminal are terminal; Transient, InProgress and LeaseLost retry.
func (a *Activities) Charge(ctx context.Context, in orders.OrderInput) (orders.ChargeResult, error) {
	var o *orders.Order
	return DeclCharge.Run(ctx, a.run, in, step.Effect[orders.OrderInput, orders.ChargeResult]{
		// Refuse before claiming, so that a stored outcome is never overwritten.
		Check: func(ctx context.Context, c *call) (err error) {
			if a.stripe == nil {
				return c.Fail(step.ErrTypeTerminal, "the worker has no Stripe client")
			}
			if o, err = a.loadOrder(ctx, c); err != nil {
				return err
			}
			if err := o.CheckRunnable(); err != nil {
				return &step.Error{Type: step.ErrTypeInvalidState, Message: c.String() + ": " + err.Error()}
			}
			return nil
		},
		// No claim of the charge's key precedes its order.
		NotBefore: func(*call) time.Time { return o.CreatedAt },
		Fingerprint: func(*call) []string {
			return []string{strconv.FormatInt(o.AmountMinor, 10), o.Currency, o.PaymentMethod}
		},
		Do: func(ctx context.Context, c *call) (orders.ChargeResult, error) { return a.charge(ctx, c, o) },
	})
}

// charge charges o once under c's claim.
func (a *Activities) charge(ctx context.Context, c *call, o *orders.Order) (orders.ChargeResult, error) {
	// An earlier attempt may have charged: the claim is not new, the order
	// moved on, or its record may have been pruned. Ask Stripe.
	if c.Claim.Mode != effects.ModeNew || o.Status != orders.StatusPending || time.Since(o.CreatedAt) > step.RecordHorizon {
		pi, err := a.findCharge(ctx, c.Key, o)
		if err != nil {
			return orders.ChargeResult{}, err
		}
		if pi != nil {
			c.Log.InfoContext(ctx, "found the charge of an earlier attempt; not charging again",
				"mode", string(c.Claim.Mode), "payment_intent", pi.ID)
			return stripestep.ChargeResult(pi), nil
		}
	}
	if o.Status != orders.StatusPending {
		// No charge at Stripe, yet the order moved on: settled elsewhere.
		return orders.ChargeResult{}, c.Fail(step.ErrTypeInvalidState, "order is %s, not pending; refusing to charge", o.Status)
	}
	pi, err := a.createCharge(ctx, c.Key, o)
	if err != nil {
		return orders.ChargeResult{}, err
	}
	if pi.Status != stripe.PaymentIntentStatusSucceeded {
		return orders.ChargeResult{}, c.Fail(step.ErrTypePaymentIncomplete, "payment intent %s is %s, not succeeded", pi.ID, pi.Status)
	}
	c.Log.InfoContext(ctx, "charged", "payment_intent", pi.ID, "mode", string(c.Claim.Mode))
	return stripestep.ChargeResult(pi), nil
}

// createCharge creates and confirms o's PaymentIntent under key.
func (a *Activities) createCharge(ctx context.Context, key effects.Key, o *orders.Order) (*stripe.PaymentIntent, error) {
	params := &stripe.PaymentIntentParams{
		Amount:             stripe.Int64(o.AmountMinor),
		Currency:           stripe.String(o.Currency),
		PaymentMethod:      stripe.String(o.PaymentMethod),
		PaymentMethodTypes: stripe.StringSlice([]string{"card"}),
		Confirm:            stripe.Bool(true),
		Description:        stripe.String("order " + o.ID),
	}
	params.Context = ctx
	// The effect key, never one stripe-go generates per request.
	params.SetIdempotencyKey(key.String())
	params.AddMetadata(stripestep.MetadataEffectKey, key.String())
	params.AddMetadata(stripestep.MetadataTenantID, o.TenantID)
	params.AddMetadata("order_id", o.ID)
	pi, err := a.stripe.PaymentIntents.New(params)
	if err != nil {
		return nil, stripestep.Error("charge "+key.String(), err)
	}
	return pi, nil
}

// findCharge returns a succeeded PaymentIntent of o made under key, or
// nil; one for another amount is KeyReused. A charge too recent for
// Stripe's search is still caught by the idempotency key.
func (a *Activities) findCharge(ctx context.Context, key effects.Key, o *orders.Order) (*stripe.PaymentIntent, error) {
	return stripestep.FindCharge(ctx, a.stripe, key, func(pi *stripe.PaymentIntent) (bool, error) {
		switch m, problem := stripestep.IntentMismatch(pi, key, o.AmountMinor, o.Currency); m {
		case stripestep.Matches:
			return true, nil
		case stripestep.OtherAmount:
			return false, &step.Error{Type: step.ErrTypeKeyReused, Message: "charge " + key.String() + ": payment intent " + pi.ID + " under this key " + problem}
		}
		return false, nil
	})
}
