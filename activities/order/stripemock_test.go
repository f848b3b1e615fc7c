package order_test

import (
	"context"
	"fmt"
	"log/slog"
	"testing"

	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/log"
	"go.temporal.io/sdk/testsuite"

	ordersteps "github.com/keyedhq/keyed/activities/order"
	"github.com/keyedhq/keyed/activities/stripestep"
	"github.com/keyedhq/keyed/internal/stripemock"
	"github.com/keyedhq/keyed/orders"
	"github.com/keyedhq/keyed/pipeline"
	"github.com/keyedhq/keyed/step"
)

// TestStripeMockContract runs Charge's Stripe requests against stripe-mock,
// which checks every request against Stripe's OpenAPI spec and answers 400
// for a parameter Stripe would refuse. stripe-mock answers with fixtures, so
// its payment intent never reaches succeeded: the full activity therefore
// stops with PaymentIncomplete, which proves the request was accepted.
func TestStripeMockContract(t *testing.T) {
	t.Parallel()
	base := stripemock.Start(t)
	b := setup(t)
	api, err := stripestep.NewClient("sk_test_123", base, nil) // The shape stripe-mock accepts.
	require.NoError(t, err)
	quiet := slog.New(slog.DiscardHandler)
	acts, err := ordersteps.New(pipeline.Deps{DB: b.pool, Effects: b.claims, Logger: quiet, Providers: []any{api, senderFor(t, b)}})
	require.NoError(t, err)
	var suite testsuite.WorkflowTestSuite
	suite.SetLogger(log.NewStructuredLogger(quiet))
	env := suite.NewTestActivityEnvironment()
	require.NoError(t, step.Register(env, acts.Definitions()...))
	env.RegisterActivityWithOptions(func(ctx context.Context, in orders.OrderInput) (string, error) {
		pi, err := ordersteps.CreateChargeForTest(ctx, acts, in)
		if err != nil {
			return "", err
		}
		return fmt.Sprintf("%s %d %s", pi.PaymentMethod.ID, pi.Amount, pi.Currency), nil
	}, activity.RegisterOptions{Name: "ContractCreate"})
	env.RegisterActivityWithOptions(func(ctx context.Context, in orders.OrderInput) (string, error) {
		pi, err := ordersteps.FindChargeForTest(ctx, acts, in)
		if err != nil || pi == nil {
			return "", err
		}
		return pi.ID, nil
	}, activity.RegisterOptions{Name: "ContractSearch"})
	in := b.order(t, "9f3a", "pm_card_visa")

	// The create request: accepted, and its parameters reflected back.
	val, err := env.ExecuteActivity("ContractCreate", in)
	require.NoError(t, err, "stripe-mock refused the create request")
	var created string
	require.NoError(t, val.Get(&created))
	require.Equal(t, "pm_card_visa 1250 eur", created)

	// The search request of a takeover: accepted. Its fixture hit has
	// neither our effect key nor status succeeded, so nothing is found.
	val, err = env.ExecuteActivity("ContractSearch", in)
	require.NoError(t, err, "stripe-mock refused the search request")
	var found string
	require.NoError(t, val.Get(&found))
	require.Empty(t, found)

	// The whole activity.
	_, err = env.ExecuteActivity(ordersteps.NameCharge, in)
	app := requireTerminal(t, err, step.ErrTypePaymentIncomplete)
	require.Contains(t, app.Error(), "requires_payment_method")
}
