package refund

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/stripe/stripe-go/v76"

	"github.com/keyedhq/keyed/activities/stripestep"
	"github.com/keyedhq/keyed/effects"
	"github.com/keyedhq/keyed/orders"
	"github.com/keyedhq/keyed/refunds"
	"github.com/keyedhq/keyed/step"
)

// RefundAtStripe refunds the reserved amount at Stripe, once, against the
// PaymentIntent of the order's charge (its record, or Stripe's search when
// the record was pruned).
//
// Effect class: external create, the effect key as Idempotency-Key and
// metadata; an attempt after an earlier one (or on an old refund) lists the
// PaymentIntent's refunds first. The outcome is also recorded in
// refund_stripe_outcomes.
//
// Errors: InvalidInput, InvalidState (not reserved, released, or no
// succeeded charge), ProviderRejected, KeyReused and Terminal are terminal;
// Transient, InProgress and LeaseLost retry.
func (a *Activities) RefundAtStripe(ctx context.Context, in refunds.RefundInput) (refunds.StripeResult, error) {
	var e *refunds.Entry
	var charge orders.ChargeResult
	return DeclStripe.Run(ctx, a.run, in, effect[refunds.StripeResult]{
		Check: func(ctx context.Context, c *call) (err error) {
			if a.stripe == nil {
				return c.Fail(step.ErrTypeTerminal, "the worker has no Stripe client")
			}
			if e, err = a.entry(ctx, c); err != nil {
				return err
			}
			if err := a.notReleased(ctx, c); err != nil {
				return err
			}
			charge, err = a.charge(ctx, c)
			return err
		},
		// No claim of the refund's key precedes its reservation.
		NotBefore:   func(*call) time.Time { return e.CreatedAt },
		Fingerprint: func(*call) []string { return []string{strconv.FormatInt(e.AmountMinor, 10), charge.PaymentIntentID} },
		Do: func(ctx context.Context, c *call) (refunds.StripeResult, error) {
			return a.refund(ctx, c, e, charge)
		},
	})
}

// notReleased returns an InvalidState error when the refund was released
// after Stripe refused it: a refund ID asks Stripe once.
func (a *Activities) notReleased(ctx context.Context, c *call) error {
	rel, err := a.ledger.Released(ctx, c.In.TenantID, c.In.OrderID, c.In.RefundID)
	if err != nil || rel == nil {
		return err
	}
	return c.Fail(step.ErrTypeInvalidState, "refund %s was released after Stripe refused it (%s); refund again under a new refund ID",
		c.In.RefundID, rel.Code)
}

// charge returns the outcome of the order's charge: its effect record's,
// or, when that record is gone (pruned after the effects retention, while
// refunds often come later), the succeeded PaymentIntent Stripe has under
// the charge's effect key. It returns an InvalidState error when the charge
// did not succeed or neither knows it.
func (a *Activities) charge(ctx context.Context, c *call) (orders.ChargeResult, error) {
	var res orders.ChargeResult
	key, err := orders.NewOrderInput(c.In.TenantID, c.In.OrderID).EffectKey(orders.StepCharge)
	if err != nil {
		return res, err
	}
	rec, err := a.claims.Get(ctx, key)
	switch {
	case errors.Is(err, effects.ErrNotFound):
		return a.searchCharge(ctx, c, key)
	case err != nil:
		return res, fmt.Errorf("refund %s: read charge: %w", c.Key, err)
	case rec.State != effects.StateSucceeded:
		return res, c.Fail(step.ErrTypeInvalidState, "charge %s is %s, not succeeded", key, rec.State)
	}
	if err := json.Unmarshal(rec.Result, &res); err != nil || res.PaymentIntentID == "" {
		return res, c.Fail(step.ErrTypeInvalidState, "charge %s stores no payment intent", key)
	}
	return res, nil
}

// searchCharge finds the succeeded PaymentIntent whose metadata effect_key
// is the order's charge key.
func (a *Activities) searchCharge(ctx context.Context, c *call, key effects.Key) (orders.ChargeResult, error) {
	pi, err := stripestep.FindCharge(ctx, a.stripe, key, func(pi *stripe.PaymentIntent) (bool, error) {
		return pi.Status == stripe.PaymentIntentStatusSucceeded, nil
	})
	switch {
	case err != nil:
		return orders.ChargeResult{}, fmt.Errorf("%s: %w", c, err)
	case pi == nil:
		return orders.ChargeResult{}, c.Fail(step.ErrTypeInvalidState, "no charge recorded under %s, and none at Stripe", key)
	}
	return stripestep.ChargeResult(pi), nil
}

// refund makes the refund once under c.Claim.
func (a *Activities) refund(ctx context.Context, c *call, e *refunds.Entry, charge orders.ChargeResult) (refunds.StripeResult, error) {
	if c.Claim.Mode != effects.ModeNew || time.Since(e.CreatedAt) > step.RecordHorizon {
		r, err := a.findRefund(ctx, c, charge.PaymentIntentID)
		if err != nil {
			return refunds.StripeResult{}, err
		}
		if r != nil {
			c.Log.InfoContext(ctx, "found the refund of an earlier attempt; not refunding again", "mode", string(c.Claim.Mode), "stripe_refund", r.ID)
			return a.record(ctx, c, e, r, charge)
		}
	}
	params := &stripe.RefundParams{PaymentIntent: stripe.String(charge.PaymentIntentID), Amount: stripe.Int64(e.AmountMinor)}
	params.Context = ctx
	params.SetIdempotencyKey(c.Key.String())
	params.AddMetadata(stripestep.MetadataEffectKey, c.Key.String())
	params.AddMetadata("refund_id", e.RefundID)
	params.AddMetadata(stripestep.MetadataTenantID, e.TenantID)
	params.AddMetadata("order_id", e.OrderID)
	r, err := a.stripe.Refunds.New(params)
	if err != nil {
		return refunds.StripeResult{}, stripestep.Error(c.String()+": create refund", err)
	}
	c.Log.InfoContext(ctx, "refunded", "stripe_refund", r.ID, "status", string(r.Status), "mode", string(c.Claim.Mode))
	return a.record(ctx, c, e, r, charge)
}

// record checks Stripe's answer and stores it in refund_stripe_outcomes.
func (a *Activities) record(ctx context.Context, c *call, e *refunds.Entry, r *stripe.Refund, charge orders.ChargeResult) (refunds.StripeResult, error) {
	if r.Status == stripe.RefundStatusFailed || r.Status == stripe.RefundStatusCanceled {
		return refunds.StripeResult{}, c.Fail(step.ErrTypeProviderRejected, "Stripe refund %s is %s (%s)", r.ID, r.Status, r.FailureReason)
	}
	if r.Amount != e.AmountMinor {
		return refunds.StripeResult{}, c.Fail(step.ErrTypeKeyReused, "Stripe refund %s under this key is for %d, the ledger for %d", r.ID, r.Amount, e.AmountMinor)
	}
	res := refunds.StripeResult{RefundID: r.ID, PaymentIntentID: charge.PaymentIntentID, Status: string(r.Status), AmountMinor: r.Amount, Currency: string(r.Currency)}
	if res.Currency == "" {
		res.Currency = charge.Currency
	}
	if err := a.ledger.RecordStripe(ctx, e, res, c.Key.String()); err != nil {
		return refunds.StripeResult{}, effects.Transient(err) // Stripe refunded; the retry finds it by metadata.
	}
	return res, nil
}

// findRefund returns the PaymentIntent's refund carrying c's effect key in
// its metadata, or nil.
func (a *Activities) findRefund(ctx context.Context, c *call, paymentIntentID string) (*stripe.Refund, error) {
	params := &stripe.RefundListParams{PaymentIntent: stripe.String(paymentIntentID)}
	params.Context = ctx
	it := a.stripe.Refunds.List(params)
	for it.Next() {
		if r := it.Refund(); r.Metadata[stripestep.MetadataEffectKey] == c.Key.String() {
			return r, nil
		}
	}
	if err := it.Err(); err != nil {
		return nil, stripestep.Error(c.String()+": list refunds of "+paymentIntentID, err)
	}
	return nil, nil
}
