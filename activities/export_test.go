package activities

import (
	"context"

	"github.com/stripe/stripe-go/v76"

	"github.com/keyedhq/keyed/orders"
)

// Fingerprint exposes the claim fingerprint to the external tests, so that
// they can leave behind the claim of a crashed attempt.
var Fingerprint = fingerprint

// CreateChargeForTest makes the Stripe create request Charge makes, without
// the claim, for the contract test against stripe-mock.
func CreateChargeForTest(ctx context.Context, a *Activities, in orders.CheckoutInput) (*stripe.PaymentIntent, error) {
	r, err := a.begin(ctx, in, orders.StepCharge)
	if err != nil {
		return nil, err
	}
	return a.createCharge(ctx, r)
}

// FindChargeForTest makes the Stripe search request Charge makes on a
// takeover, without the claim.
func FindChargeForTest(ctx context.Context, a *Activities, in orders.CheckoutInput) (*stripe.PaymentIntent, error) {
	r, err := a.begin(ctx, in, orders.StepCharge)
	if err != nil {
		return nil, err
	}
	return a.findCharge(ctx, r)
}
