package order

import (
	"context"

	"github.com/stripe/stripe-go/v76"

	"github.com/keyedhq/keyed/effects"
	"github.com/keyedhq/keyed/orders"
	"github.com/keyedhq/keyed/step"
)

// DemoDefinitions returns the activities of the example files
// (docs/adding-an-activity.md) bound to a, for the tests to register beside
// Definitions.
func DemoDefinitions(a *Activities) []step.Definition {
	return []step.Definition{
		DeclSendSurvey.Bind(a.SendSurvey),
		DeclSendThanks.Bind(a.SendThanks),
	}
}

// chargeOf returns the charge key and the order of in.
func chargeOf(ctx context.Context, a *Activities, in orders.OrderInput) (effects.Key, *orders.Order, error) {
	key, err := in.EffectKey(orders.StepCharge)
	if err != nil {
		return key, nil, err
	}
	o, err := a.orders.Get(ctx, in.TenantID, in.OrderID)
	return key, o, err
}

// CreateChargeForTest makes the Stripe create request Charge makes, without
// the claim, for the contract test against stripe-mock.
func CreateChargeForTest(ctx context.Context, a *Activities, in orders.OrderInput) (*stripe.PaymentIntent, error) {
	key, o, err := chargeOf(ctx, a, in)
	if err != nil {
		return nil, err
	}
	return a.createCharge(ctx, key, o)
}

// FindChargeForTest makes the Stripe search request Charge makes on a
// takeover, without the claim.
func FindChargeForTest(ctx context.Context, a *Activities, in orders.OrderInput) (*stripe.PaymentIntent, error) {
	key, o, err := chargeOf(ctx, a, in)
	if err != nil {
		return nil, err
	}
	return a.findCharge(ctx, key, o)
}
