package fakestripe

import (
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/stripe/stripe-go/v76"
	stripeclient "github.com/stripe/stripe-go/v76/client"

	"github.com/keyedhq/keyed/internal/stripemock"
)

// TestRefundStripeMockContract sends keyed's refund requests to stripe-mock,
// which checks every request against Stripe's OpenAPI spec and answers 400
// for a parameter Stripe would refuse, and then the same requests to this
// fake, so that the fake accepts what Stripe accepts and answers in a shape
// stripe-go reads. stripe-mock answers with fixtures, so only acceptance and
// the reflected parameters are compared.
func TestRefundStripeMockContract(t *testing.T) {
	t.Parallel()
	mock := stripeMockAPI(t, stripemock.Start(t))

	req := keyedRefundRequest("pi_contract", 700, "t1:refund:o1:r1:refund_stripe")
	re, err := mock.Refunds.New(req)
	require.NoError(t, err, "stripe-mock refused the refund request")
	require.Equal(t, "refund", re.Object)

	// stripe-mock does check: a reason outside Stripe's enum is refused,
	// by stripe-mock and by the fake.
	bad := keyedRefundRequest("pi_contract", 700, "t1:refund:o1:r2:refund_stripe")
	bad.Reason = stripe.String("changed_mind")
	_, err = mock.Refunds.New(bad)
	require.Equal(t, http.StatusBadRequest, stripeErr(t, err).HTTPStatusCode)

	list := &stripe.RefundListParams{PaymentIntent: stripe.String("pi_contract")}
	list.Limit = stripe.Int64(100)
	it := mock.Refunds.List(list)
	for it.Next() {
		require.NotEmpty(t, it.Refund().ID)
	}
	require.NoError(t, it.Err(), "stripe-mock refused the refund list request")
	_, err = mock.Refunds.Get(re.ID, nil)
	require.NoError(t, err, "stripe-mock refused the refund get request")

	// The fake accepts the same requests.
	b := setup(t)
	sc := api(b.ts, testKey)
	piID := b.paid(t, "o1")
	req = keyedRefundRequest(piID, 700, "t1:refund:o1:r1:refund_stripe")
	got, err := sc.Refunds.New(req)
	require.NoError(t, err)
	require.EqualValues(t, 700, got.Amount)
	require.Equal(t, req.Metadata, got.Metadata)
	list.PaymentIntent = stripe.String(piID)
	it = sc.Refunds.List(list)
	require.True(t, it.Next())
	require.Equal(t, got.ID, it.Refund().ID)
	require.NoError(t, it.Err())
	bad = keyedRefundRequest(piID, 700, "t1:refund:o1:r2:refund_stripe")
	bad.Reason = stripe.String("changed_mind")
	_, err = sc.Refunds.New(bad)
	require.Equal(t, http.StatusBadRequest, stripeErr(t, err).HTTPStatusCode)
}

// keyedRefundRequest returns the refund request keyed's RefundAtStripe
// sends: the payment intent, the ledger's amount, the customer's reason,
// the effect key as Idempotency-Key and in metadata, with the refund,
// tenant and order IDs.
func keyedRefundRequest(piID string, amount int64, effectKey string) *stripe.RefundParams {
	p := &stripe.RefundParams{PaymentIntent: stripe.String(piID), Amount: stripe.Int64(amount),
		Reason: stripe.String(string(stripe.RefundReasonRequestedByCustomer))}
	p.SetIdempotencyKey(effectKey)
	p.AddMetadata("effect_key", effectKey)
	p.AddMetadata("refund_id", "r1")
	p.AddMetadata("tenant_id", "t1")
	p.AddMetadata("order_id", "o1")
	return p
}

// stripeMockAPI returns a stripe-go client for stripe-mock at base.
func stripeMockAPI(t *testing.T, base string) *stripeclient.API {
	t.Helper()
	b := stripe.GetBackendWithConfig(stripe.APIBackend, &stripe.BackendConfig{
		URL:               stripe.String(base),
		HTTPClient:        &http.Client{Timeout: 10 * time.Second},
		MaxNetworkRetries: stripe.Int64(0),
		LeveledLogger:     &stripe.LeveledLogger{Level: stripe.LevelNull},
	})
	return stripeclient.New("sk_test_123", &stripe.Backends{API: b, Connect: b, Uploads: b})
}
