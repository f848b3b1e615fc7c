package activities

import (
	"context"

	"github.com/stripe/stripe-go/v76"

	"github.com/keyedhq/keyed/orders"
)

// DemoDefinitions returns the activities of the example files (README,
// "Adding a keyed activity") bound to a, for the tests to register beside
// Definitions.
func DemoDefinitions(a *Activities) []Definition {
	return []Definition{
		DeclSendSurvey.Bind(a.SendSurvey),
		DeclSendThanks.Bind(a.SendThanks),
	}
}

// chargeStep prepares the charge step of in and loads its order, as
// Keyed.Run does before the claim.
func chargeStep(ctx context.Context, a *Activities, in orders.OrderInput) (*Step, error) {
	s, err := a.prepare(ctx, in, DeclCharge.Step)
	if err != nil {
		return nil, err
	}
	if s.Order, err = a.orders.Get(ctx, in.TenantID, in.OrderID); err != nil {
		return nil, loadOrderError(s, err)
	}
	return s, nil
}

// CreateChargeForTest makes the Stripe create request Charge makes, without
// the claim, for the contract test against stripe-mock.
func CreateChargeForTest(ctx context.Context, a *Activities, in orders.OrderInput) (*stripe.PaymentIntent, error) {
	s, err := chargeStep(ctx, a, in)
	if err != nil {
		return nil, err
	}
	return a.createCharge(ctx, s)
}

// FindChargeForTest makes the Stripe search request Charge makes on a
// takeover, without the claim.
func FindChargeForTest(ctx context.Context, a *Activities, in orders.OrderInput) (*stripe.PaymentIntent, error) {
	s, err := chargeStep(ctx, a, in)
	if err != nil {
		return nil, err
	}
	return a.findCharge(ctx, s)
}
