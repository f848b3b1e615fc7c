package step_test

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/keyedhq/keyed/step"
)

// charge is an outcome type that validates itself.
type charge struct {
	PaymentIntentID string `json:"payment_intent_id"`
	AmountMinor     int64  `json:"amount_minor"`
}

func (c charge) Validate() error {
	return step.Problems(step.ProviderIDProblem("payment_intent_id", "pi_", "a Stripe PaymentIntent ID", c.PaymentIntentID),
		step.AmountProblem("amount_minor", c.AmountMinor))
}

// DecodeOutcome decodes strictly and validates, naming what is wrong
// without Go's type names.
func TestDecodeOutcomeIsStrict(t *testing.T) {
	t.Parallel()
	shape := `{"payment_intent_id":"…","amount_minor":0}`
	for result, want := range map[string]string{
		``:                                   "result is required with done: the step's outcome, " + shape,
		`null`:                               "result is required with done",
		`{"payment_intent_id":"pi_1","x":1}`: `result has the unknown field "x"; want ` + shape,
		`{"amount_minor":"25"}`:              `result field "amount_minor" must be a whole number, not string`,
		`["pi_1"]`:                           "result must be an object, not array",
		`{"payment_intent_id":"pi_1"} {}`:    "result holds more than one JSON value",
		`{"payment_intent_id":`:              "result is not valid JSON",
		`{}`: `result: payment_intent_id is required: a Stripe PaymentIntent ID, pi_…; ` +
			`amount_minor 0 is not an amount in minor units (a positive whole number)`,
		`{"payment_intent_id":"pi_1/../x","amount_minor":1}`: `payment_intent_id "pi_1/../x" is not a Stripe PaymentIntent ID`,
	} {
		_, err := step.OutcomeOf[charge]().Decode(json.RawMessage(result))
		require.ErrorContains(t, err, want, result)
		require.NotContains(t, err.Error(), "step_test.", "no Go names: %v", err)
	}
	got, err := step.OutcomeOf[charge]().Decode(json.RawMessage(`{"payment_intent_id":"pi_1","amount_minor":2500}`))
	require.NoError(t, err)
	require.Equal(t, charge{PaymentIntentID: "pi_1", AmountMinor: 2500}, got)
	decl := step.Declare[ticket, charge](step.Declaration{Name: "Refund", Step: "refund"})
	require.Equal(t, step.OutcomeOf[charge](), decl.Outcome, "Declare sets it from the outcome type")
	require.Equal(t, shape, decl.Outcome.Shape())
}

func TestProblemsJoinsTheNonEmptyOnes(t *testing.T) {
	t.Parallel()
	require.NoError(t, step.Problems("", ""))
	require.EqualError(t, step.Problems("a", "", "b"), "a; b")
	require.Empty(t, step.OneOfProblem("status", "paid", "paid", "refunded"))
	require.Equal(t, `status "x" is not "paid" or "refunded"`, step.OneOfProblem("status", "x", "paid", "refunded"))
	require.NotEmpty(t, step.CurrencyProblem("currency", "EUR"))
	require.NotEmpty(t, step.MessageIDProblem("message_id", "a b"))
}
