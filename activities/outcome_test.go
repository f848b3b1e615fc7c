package activities_test

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/keyedhq/keyed/activities"
	"github.com/keyedhq/keyed/orders"
)

// DecodeOutcome decodes strictly and validates, naming what is wrong
// without Go's type names.
func TestDecodeOutcomeIsStrict(t *testing.T) {
	t.Parallel()
	shape := `{"payment_intent_id":"…","status":"…","amount_minor":0,"currency":"…"}`
	for result, want := range map[string]string{
		``:                                   "result is required with done: the step's outcome, " + shape,
		`null`:                               "result is required with done",
		`{"payment_intent_id":"pi_1","x":1}`: `result has the unknown field "x"; want ` + shape,
		`{"amount_minor":"25"}`:              `result field "amount_minor" must be a whole number, not string`,
		`["pi_1"]`:                           "result must be an object, not array",
		`{"payment_intent_id":"pi_1"} {}`:    "result holds more than one JSON value",
		`{"payment_intent_id":`:              "result is not valid JSON",
		`{}`: `result: payment_intent_id is required: a Stripe PaymentIntent ID, pi_…; status "" is not "succeeded"; ` +
			`amount_minor 0 is not an amount in minor units (a positive whole number); currency "" is not a currency`,
		`{"payment_intent_id":"pi_1/../x","status":"succeeded","amount_minor":1,"currency":"EUR"}`: `payment_intent_id "pi_1/../x" is not a Stripe PaymentIntent ID`,
	} {
		_, err := activities.DecodeOutcome[orders.ChargeResult](json.RawMessage(result))
		require.ErrorContains(t, err, want, result)
		require.NotContains(t, err.Error(), "orders.", "no Go names: %v", err)
	}
	got, err := activities.DecodeOutcome[orders.ChargeResult](json.RawMessage(`{"payment_intent_id":"pi_1","status":"succeeded","amount_minor":2500,"currency":"eur"}`))
	require.NoError(t, err)
	require.Equal(t, orders.ChargeResult{PaymentIntentID: "pi_1", Status: "succeeded", AmountMinor: 2500, Currency: "eur"}, got)
	require.Equal(t, activities.OutcomeOf[orders.ChargeResult](), activities.DeclCharge.Outcome, "Declare sets it from the outcome type")
	require.Equal(t, shape, activities.DeclCharge.Outcome.Shape())
}
