package activities

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/stripe/stripe-go/v76"

	"github.com/keyedhq/keyed/effects"
	"github.com/keyedhq/keyed/orders"
)

// Charge charges the order's payment method for its amount, once.
//
// Effect class: external create. The effect key ("…:charge") is claimed in
// Postgres and sent to Stripe as the Idempotency-Key of a PaymentIntent
// created with confirm=true, and as its metadata effect_key. A repeat after
// success returns the stored ChargeResult without calling Stripe. An attempt
// that finds the claim from an earlier attempt (re-entry, takeover, retry
// after a transient failure) first searches Stripe for a payment intent with
// that metadata and uses a succeeded one, because Stripe forgets idempotency
// keys after 24 hours; otherwise it creates with the same key, which Stripe
// answers with the first outcome. While Stripe is slow the lease is renewed
// and a Temporal heartbeat recorded; a lost lease cancels the request.
//
// Errors (through ToTemporal): InvalidInput, OrderNotFound, InvalidState
// (the order is not pending), CardDeclined, PaymentIncomplete (a status
// other than succeeded, such as requires_action), KeyReused, ProviderRejected
// and Terminal are non-retryable; Transient (timeouts, resets, 429, 5xx, 409
// idempotency_key_in_use or lock_timeout), InProgress and LeaseLost are
// retryable with the same key.
func (a *Activities) Charge(ctx context.Context, in orders.OrderInput) (orders.ChargeResult, error) {
	return DeclCharge.Run(ctx, a, in, Effect[orders.ChargeResult]{
		// Refuse before claiming, so that the stored outcome of its charge
		// is never overwritten.
		Check: func(s *Step) error {
			if err := s.Order.CheckRunnable(); err != nil {
				return &Error{Type: ErrTypeInvalidState, kind: ErrInvalidState, Message: fmt.Sprintf("charge %s: %v", s.Key, err)}
			}
			return nil
		},
		Fingerprint: func(s *Step) []string {
			return []string{strconv.FormatInt(s.Order.AmountMinor, 10), s.Order.Currency, s.Order.PaymentMethod}
		},
		Do: a.charge,
	})
}

// charge charges once under s's claim.
func (a *Activities) charge(ctx context.Context, s *Step) (orders.ChargeResult, error) {
	o := s.Order
	// An earlier attempt may have charged: the claim is not new, the order
	// moved on, or the order is old enough that its record may have been
	// pruned (and Stripe has forgotten the key). Ask Stripe.
	if s.Claim.Mode != effects.ModeNew || o.Status != orders.StatusPending || time.Since(o.CreatedAt) > RecordHorizon {
		pi, err := a.findCharge(ctx, s)
		if err != nil {
			return orders.ChargeResult{}, err
		}
		if pi != nil {
			s.Log.InfoContext(ctx, "found the charge of an earlier attempt; not charging again",
				"mode", string(s.Claim.Mode), "payment_intent", pi.ID)
			return chargeResult(pi), nil
		}
	}
	if o.Status != orders.StatusPending {
		// No charge at Stripe, yet the order moved on: it was settled
		// elsewhere. Never charge it.
		return orders.ChargeResult{}, &Error{Type: ErrTypeInvalidState, kind: ErrInvalidState,
			Message: fmt.Sprintf("charge %s: order is %s, not pending; refusing to charge", s.Key, o.Status)}
	}
	pi, err := a.createCharge(ctx, s)
	if err != nil {
		return orders.ChargeResult{}, err
	}
	if pi.Status != stripe.PaymentIntentStatusSucceeded {
		return orders.ChargeResult{}, &Error{Type: ErrTypePaymentIncomplete, kind: ErrPaymentIncomplete,
			Message: fmt.Sprintf("charge %s: payment intent %s is %s, not succeeded", s.Key, pi.ID, pi.Status)}
	}
	s.Log.InfoContext(ctx, "charged", "payment_intent", pi.ID, "mode", string(s.Claim.Mode))
	return chargeResult(pi), nil
}

// createCharge creates and confirms the payment intent under the effect key.
func (a *Activities) createCharge(ctx context.Context, r *Step) (*stripe.PaymentIntent, error) {
	o := r.Order
	params := &stripe.PaymentIntentParams{
		Amount:             stripe.Int64(o.AmountMinor),
		Currency:           stripe.String(o.Currency),
		PaymentMethod:      stripe.String(o.PaymentMethod),
		PaymentMethodTypes: stripe.StringSlice([]string{"card"}),
		Confirm:            stripe.Bool(true),
		Description:        stripe.String("order " + o.ID),
	}
	params.Context = ctx
	// The effect key, never a key stripe-go generates per request: every
	// attempt of this charge must send the same one.
	params.SetIdempotencyKey(r.Key.String())
	params.AddMetadata("effect_key", r.Key.String())
	params.AddMetadata("tenant_id", o.TenantID)
	params.AddMetadata("order_id", o.ID)
	pi, err := a.stripe.PaymentIntents.New(params)
	if err != nil {
		return nil, StripeError("charge "+r.Key.String(), err)
	}
	return pi, nil
}

// findCharge returns a succeeded payment intent created under the effect
// key by an earlier attempt, or nil. Stripe's search index lags creation by
// up to about a minute; a charge too recent to be found is still caught by
// the idempotency key, which Stripe keeps for 24 hours.
func (a *Activities) findCharge(ctx context.Context, r *Step) (*stripe.PaymentIntent, error) {
	params := &stripe.PaymentIntentSearchParams{SearchParams: stripe.SearchParams{Query: searchQuery(r.Key.String()), Context: ctx}}
	it := a.stripe.PaymentIntents.Search(params)
	for it.Next() {
		pi := it.PaymentIntent()
		switch m, problem := intentMismatch(pi, r.Key.String(), r.Order.AmountMinor, r.Order.Currency); m {
		case intentMatches:
			return pi, nil
		case intentOtherAmount:
			return nil, &Error{Type: ErrTypeKeyReused, kind: effects.ErrKeyReused, Message: fmt.Sprintf(
				"charge %s: payment intent %s under this key %s", r.Key, pi.ID, problem)}
		}
	}
	if err := it.Err(); err != nil {
		return nil, StripeError("search charges for "+r.Key.String(), err)
	}
	return nil, nil
}

func chargeResult(pi *stripe.PaymentIntent) orders.ChargeResult {
	return orders.ChargeResult{PaymentIntentID: pi.ID, Status: string(pi.Status), AmountMinor: pi.Amount, Currency: string(pi.Currency)}
}
