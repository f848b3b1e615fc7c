package stripestep_test

import (
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/stripe/stripe-go/v76"

	"github.com/keyedhq/keyed/activities/stripestep"
)

// Code reads back the code Error wrote into its message, for each shape of
// Stripe error, and nothing from a message without one.
func TestCodeReadsErrorsMessage(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		err  *stripe.Error
		want string
	}{
		{&stripe.Error{HTTPStatusCode: 400, Type: stripe.ErrorTypeInvalidRequest, Code: stripe.ErrorCodeChargeDisputed, Msg: "disputed"}, "charge_disputed"},
		{&stripe.Error{HTTPStatusCode: 400, Type: stripe.ErrorTypeInvalidRequest, Code: stripe.ErrorCodeChargeAlreadyRefunded, Msg: "refunded", RequestID: "req_1"}, "charge_already_refunded"},
		{&stripe.Error{HTTPStatusCode: 402, Type: stripe.ErrorTypeCard, Code: stripe.ErrorCodeCardDeclined, DeclineCode: "insufficient_funds", Msg: "declined"}, "card_declined"},
		{&stripe.Error{HTTPStatusCode: 401, Type: stripe.ErrorTypeInvalidRequest, Msg: "bad key"}, ""},
	} {
		err := stripestep.Error("refund acme:order:9f3a:refund:r1:refund_stripe", tc.err)
		require.Equal(t, tc.want, stripestep.Code(err.Error()), err.Error())
	}
	require.Empty(t, stripestep.Code("ProviderRejected: Stripe refund re_1 is failed (expired_or_canceled_card)"))
}

func TestNewClientValidates(t *testing.T) {
	t.Parallel()
	_, err := stripestep.NewClient(" ", "", nil)
	require.ErrorContains(t, err, "secret key is empty")
	_, err = stripestep.NewClient("sk_test_1", "api.stripe.com", nil)
	require.ErrorContains(t, err, "not an http(s) URL")
	api, err := stripestep.NewClient("sk_test_1", "", nil)
	require.NoError(t, err)
	require.NotNil(t, api.PaymentIntents)
}
