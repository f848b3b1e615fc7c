package fakestripe

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/stripe/stripe-go/v76"
	stripeclient "github.com/stripe/stripe-go/v76/client"
)

// api returns a stripe-go client for ts, with its own connection pool and
// without network retries.
func api(ts *httptest.Server, key string) *stripeclient.API {
	b := stripe.GetBackendWithConfig(stripe.APIBackend, &stripe.BackendConfig{
		URL:               stripe.String(ts.URL),
		HTTPClient:        &http.Client{Transport: &http.Transport{}, Timeout: 10 * time.Second},
		MaxNetworkRetries: stripe.Int64(0),
		LeveledLogger:     &stripe.LeveledLogger{Level: stripe.LevelNull},
	})
	return stripeclient.New(key, &stripe.Backends{API: b, Connect: b, Uploads: b})
}

// paid returns the ID of a new succeeded payment intent of 1999 cents.
func (b *bundle) paid(t *testing.T, orderID string) string {
	t.Helper()
	pi, err := b.pi.New(params(orderID, "pm_card_visa", "charge:"+orderID))
	require.NoError(t, err)
	require.Equal(t, stripe.PaymentIntentStatusSucceeded, pi.Status)
	return pi.ID
}

// refundParams returns the refund request keyed sends: a reason, the
// effect key as Idempotency-Key and metadata.effect_key, and the refund ID.
func refundReq(piID string, amount int64, effectKey, refundID string) *stripe.RefundParams {
	p := &stripe.RefundParams{PaymentIntent: stripe.String(piID), Reason: stripe.String(string(stripe.RefundReasonRequestedByCustomer))}
	if amount > 0 {
		p.Amount = stripe.Int64(amount)
	}
	p.AddMetadata("effect_key", effectKey)
	p.AddMetadata("refund_id", refundID)
	p.SetIdempotencyKey(effectKey)
	return p
}

func TestRefundFull(t *testing.T) {
	t.Parallel()
	b := setup(t)
	sc := api(b.ts, testKey)
	piID := b.paid(t, "o1")

	re, err := sc.Refunds.New(refundReq(piID, 0, "t:refund:o1:r1:stripe", "r1"))
	require.NoError(t, err)
	require.True(t, strings.HasPrefix(re.ID, "re_"))
	require.Equal(t, "refund", re.Object)
	require.EqualValues(t, 1999, re.Amount, "no amount refunds what is left")
	require.Equal(t, stripe.RefundStatusSucceeded, re.Status)
	require.Equal(t, stripe.RefundReasonRequestedByCustomer, re.Reason)
	require.Equal(t, stripe.CurrencyUSD, re.Currency)
	require.Equal(t, piID, re.PaymentIntent.ID)
	require.True(t, strings.HasPrefix(re.Charge.ID, "ch_"))
	require.True(t, strings.HasPrefix(re.BalanceTransaction.ID, "txn_"))
	require.Equal(t, map[string]string{"effect_key": "t:refund:o1:r1:stripe", "refund_id": "r1"}, re.Metadata)
	require.Equal(t, "t:refund:o1:r1:stripe", re.LastResponse.IdempotencyKey)

	got, err := sc.Refunds.Get(re.ID, nil)
	require.NoError(t, err)
	require.Equal(t, re.ID, got.ID)
	require.Equal(t, re.Metadata, got.Metadata)
	_, err = sc.Refunds.Get("re_missing", nil)
	se := stripeErr(t, err)
	require.Equal(t, http.StatusNotFound, se.HTTPStatusCode)
	require.Equal(t, stripe.ErrorCodeResourceMissing, se.Code)

	_, err = sc.Refunds.New(refundReq(piID, 0, "t:refund:o1:r2:stripe", "r2"))
	se = stripeErr(t, err)
	require.Equal(t, http.StatusBadRequest, se.HTTPStatusCode)
	require.Equal(t, stripe.ErrorTypeInvalidRequest, se.Type)
	require.Equal(t, stripe.ErrorCodeChargeAlreadyRefunded, se.Code)
	require.Equal(t, "Charge "+re.Charge.ID+" has already been refunded.", se.Msg)

	require.Equal(t, 1, b.srv.Refunds())
	require.Equal(t, 1, b.srv.RefundsForKey("t:refund:o1:r1:stripe"))
	require.Zero(t, b.srv.RefundsForKey("t:refund:o1:r2:stripe"))
	require.Equal(t, 1, b.srv.RefundsForMetadata("refund_id", "r1"))
	require.EqualValues(t, 1999, b.srv.RefundedAmount(piID))
	require.Equal(t, 1, b.srv.Stats().Refunds)
}

func TestRefundReplay(t *testing.T) {
	t.Parallel()
	b := setup(t)
	sc := api(b.ts, testKey)
	piID := b.paid(t, "o1")

	first, err := sc.Refunds.New(refundReq(piID, 500, "k1", "r1"))
	require.NoError(t, err)
	again, err := sc.Refunds.New(refundReq(piID, 500, "k1", "r1"))
	require.NoError(t, err)
	require.Equal(t, first.ID, again.ID)
	require.Equal(t, "true", again.LastResponse.Header.Get("Idempotent-Replayed"))
	require.Equal(t, first.LastResponse.RequestID, again.LastResponse.Header.Get("Original-Request"))

	// Keys are scoped per API key, as for charges.
	other, err := api(b.ts, "sk_test_other_key_0000").Refunds.New(refundReq(piID, 500, "k1", "r1"))
	require.NoError(t, err)
	require.NotEqual(t, first.ID, other.ID)

	require.Equal(t, 2, b.srv.Refunds())
	require.Equal(t, 2, b.srv.RefundsForKey("k1"))
	require.EqualValues(t, 1000, b.srv.RefundedAmount(piID))
}

func TestRefundIdempotencyError(t *testing.T) {
	t.Parallel()
	b := setup(t)
	sc := api(b.ts, testKey)
	piID := b.paid(t, "o1")

	_, err := sc.Refunds.New(refundReq(piID, 500, "k1", "r1"))
	require.NoError(t, err)
	_, err = sc.Refunds.New(refundReq(piID, 600, "k1", "r1"))
	se := stripeErr(t, err)
	require.Equal(t, http.StatusBadRequest, se.HTTPStatusCode)
	require.Equal(t, stripe.ErrorTypeIdempotency, se.Type)

	// A key is shared by every create request: the charge's key cannot
	// create a refund.
	_, err = sc.Refunds.New(refundReq(piID, 500, "charge:o1", "r1"))
	require.Equal(t, stripe.ErrorTypeIdempotency, stripeErr(t, err).Type)
	require.Equal(t, 1, b.srv.Refunds())
}

func TestRefundInFlightConflict(t *testing.T) {
	t.Parallel()
	b := setup(t)
	sc := api(b.ts, testKey)
	piID := b.paid(t, "o1")
	b.srv.Inject(Fault{Kind: FaultLatency, Delay: 500 * time.Millisecond, Match: "POST /v1/refunds"})

	type result struct {
		re  *stripe.Refund
		err error
	}
	done := make(chan result)
	go func() {
		re, err := sc.Refunds.New(refundReq(piID, 0, "slow", "r1"))
		done <- result{re, err}
	}()
	require.Eventually(t, func() bool { return b.srv.inFlight("slow") }, 2*time.Second, time.Millisecond)

	_, err := sc.Refunds.New(refundReq(piID, 0, "slow", "r1"))
	se := stripeErr(t, err)
	require.Equal(t, http.StatusConflict, se.HTTPStatusCode)
	require.Equal(t, stripe.ErrorCodeIdempotencyKeyInUse, se.Code)

	r := <-done
	require.NoError(t, r.err)
	again, err := sc.Refunds.New(refundReq(piID, 0, "slow", "r1"))
	require.NoError(t, err)
	require.Equal(t, r.re.ID, again.ID)
	require.Equal(t, 1, b.srv.Refunds())
}

func TestRefundAmountTooLarge(t *testing.T) {
	t.Parallel()
	b := setup(t)
	sc := api(b.ts, testKey)
	piID := b.paid(t, "o1")

	_, err := sc.Refunds.New(refundReq(piID, 2000, "k-big", "r1"))
	se := stripeErr(t, err)
	require.Equal(t, http.StatusBadRequest, se.HTTPStatusCode)
	require.Equal(t, stripe.ErrorTypeInvalidRequest, se.Type)
	require.Equal(t, stripe.ErrorCodeAmountTooLarge, se.Code)
	require.Equal(t, "amount", se.Param)
	require.Equal(t, "Refund amount ($20.00) is greater than unrefunded amount on charge ($19.99)", se.Msg)

	// The refusal is stored: replaying the key refuses again, even once
	// the amount would fit.
	_, err = sc.Refunds.New(refundReq(piID, 1000, "k-half", "r2"))
	require.NoError(t, err)
	_, err = sc.Refunds.New(refundReq(piID, 2000, "k-big", "r1"))
	require.Equal(t, stripe.ErrorCodeAmountTooLarge, stripeErr(t, err).Code)

	_, err = sc.Refunds.New(refundReq(piID, 1000, "k-rest", "r3"))
	se = stripeErr(t, err)
	require.Equal(t, stripe.ErrorCodeAmountTooLarge, se.Code)
	require.Contains(t, se.Msg, "($9.99)")
	require.Equal(t, 1, b.srv.Refunds())
	require.EqualValues(t, 1000, b.srv.RefundedAmount(piID))
}

func TestPartialRefundsSumToCharge(t *testing.T) {
	t.Parallel()
	b := setup(t)
	sc := api(b.ts, testKey)
	piID := b.paid(t, "o1")

	for i, amount := range []int64{1000, 900, 99} {
		re, err := sc.Refunds.New(refundReq(piID, amount, "k"+string(rune('a'+i)), "r"))
		require.NoError(t, err)
		require.Equal(t, amount, re.Amount)
	}
	require.EqualValues(t, 1999, b.srv.RefundedAmount(piID))
	_, err := sc.Refunds.New(refundReq(piID, 1, "k-more", "r"))
	require.Equal(t, stripe.ErrorCodeChargeAlreadyRefunded, stripeErr(t, err).Code)
	require.Equal(t, 3, b.srv.Refunds())
}

func TestConcurrentPartialRefundsNeverExceedCharge(t *testing.T) {
	t.Parallel()
	b := setup(t)
	sc := api(b.ts, testKey)
	piID := b.paid(t, "o1")

	var wg sync.WaitGroup
	errs := make(chan error, 10)
	for i := range 10 {
		wg.Go(func() {
			_, err := sc.Refunds.New(refundReq(piID, 500, "k"+string(rune('a'+i)), "r"))
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	ok := 0
	for err := range errs {
		if err == nil {
			ok++
			continue
		}
		require.Contains(t, []stripe.ErrorCode{stripe.ErrorCodeAmountTooLarge, stripe.ErrorCodeChargeAlreadyRefunded}, stripeErr(t, err).Code)
	}
	require.Equal(t, 3, ok)
	require.EqualValues(t, 1500, b.srv.RefundedAmount(piID))
}

func TestRefundWithoutSuccessfulCharge(t *testing.T) {
	t.Parallel()
	b := setup(t)
	sc := api(b.ts, testKey)

	_, err := b.pi.New(params("o1", "pm_card_chargeDeclined", "charge:o1"))
	require.Error(t, err)
	declinedID := stripeErr(t, err).PaymentIntent.ID
	unconfirmed := params("o2", "pm_card_visa", "charge:o2")
	unconfirmed.Confirm = nil
	pending, err := b.pi.New(unconfirmed)
	require.NoError(t, err)

	for _, id := range []string{declinedID, pending.ID} {
		_, err = sc.Refunds.New(refundReq(id, 0, "k-"+id, "r"))
		se := stripeErr(t, err)
		require.Equal(t, http.StatusBadRequest, se.HTTPStatusCode)
		require.Equal(t, stripe.ErrorTypeInvalidRequest, se.Type)
		require.Equal(t, stripe.ErrorCodePaymentIntentUnexpectedState, se.Code)
		require.Equal(t, "payment_intent", se.Param)
	}

	_, err = sc.Refunds.New(refundReq("pi_missing", 0, "k-missing", "r"))
	se := stripeErr(t, err)
	require.Equal(t, http.StatusBadRequest, se.HTTPStatusCode)
	require.Equal(t, stripe.ErrorCodeResourceMissing, se.Code)
	require.Equal(t, "payment_intent", se.Param)
	require.Zero(t, b.srv.Refunds())
}

func TestRefundValidation(t *testing.T) {
	t.Parallel()
	b := setup(t)
	sc := api(b.ts, testKey)
	piID := b.paid(t, "o1")

	bad := refundReq(piID, 0, "k1", "r")
	bad.Reason = stripe.String("changed_mind")
	_, err := sc.Refunds.New(bad)
	require.Equal(t, "reason", stripeErr(t, err).Param)

	_, err = sc.Refunds.New(&stripe.RefundParams{Amount: stripe.Int64(5)})
	require.Equal(t, stripe.ErrorCodeParameterMissing, stripeErr(t, err).Code)

	h := http.Header{"Authorization": {"Bearer " + testKey}, "Content-Type": {"application/x-www-form-urlencoded"}}
	status, body := b.do(t, http.MethodPost, "/v1/refunds", "payment_intent="+piID+"&amount=-3", h)
	require.Equal(t, http.StatusBadRequest, status)
	require.Contains(t, body, "parameter_invalid_integer")
	status, body = b.do(t, http.MethodPost, "/v1/refunds", "payment_intent="+piID+"&colour=red", h)
	require.Equal(t, http.StatusBadRequest, status)
	require.Contains(t, body, "parameter_unknown")

	// Validation errors are not stored: the key still works.
	_, err = sc.Refunds.New(refundReq(piID, 0, "k1", "r"))
	require.NoError(t, err)

	// A refund by charge ID works too.
	pi2 := b.paid(t, "o2")
	got, err := b.pi.Get(pi2, nil)
	require.NoError(t, err)
	re, err := sc.Refunds.New(&stripe.RefundParams{Charge: stripe.String(got.LatestCharge.ID), Amount: stripe.Int64(100)})
	require.NoError(t, err)
	require.Equal(t, pi2, re.PaymentIntent.ID)
	require.Equal(t, 2, b.srv.Refunds())
}

func TestListRefunds(t *testing.T) {
	t.Parallel()
	b := setup(t)
	sc := api(b.ts, testKey)
	pi1, pi2 := b.paid(t, "o1"), b.paid(t, "o2")

	var ids []string
	for i, key := range []string{"t:refund:o1:a", "t:refund:o1:b", "t:refund:o1:c"} {
		re, err := sc.Refunds.New(refundReq(pi1, int64(100*(i+1)), key, "r"))
		require.NoError(t, err)
		ids = append([]string{re.ID}, ids...) // Newest first.
	}
	_, err := sc.Refunds.New(refundReq(pi2, 0, "t:refund:o2:a", "r"))
	require.NoError(t, err)

	lp := &stripe.RefundListParams{PaymentIntent: stripe.String(pi1)}
	lp.Limit = stripe.Int64(2)
	it := sc.Refunds.List(lp)
	var got []string
	byKey := map[string]string{}
	for it.Next() {
		got = append(got, it.Refund().ID)
		byKey[it.Refund().Metadata["effect_key"]] = it.Refund().ID
	}
	require.NoError(t, it.Err())
	require.Equal(t, ids, got, "newest first, across pages")
	require.Equal(t, ids[1], byKey["t:refund:o1:b"])

	one := &stripe.RefundListParams{PaymentIntent: stripe.String(pi1)}
	one.Limit = stripe.Int64(1)
	one.Single = true
	it = sc.Refunds.List(one)
	require.True(t, it.Next())
	require.True(t, it.RefundList().HasMore)
	require.False(t, it.Next())

	all := sc.Refunds.List(&stripe.RefundListParams{})
	n := 0
	for all.Next() {
		n++
	}
	require.NoError(t, all.Err())
	require.Equal(t, 4, n)

	missing := sc.Refunds.List(&stripe.RefundListParams{PaymentIntent: stripe.String("pi_missing")})
	require.False(t, missing.Next())
	require.Equal(t, stripe.ErrorCodeResourceMissing, stripeErr(t, missing.Err()).Code)
}

func TestRefundDropResponseThenReplay(t *testing.T) {
	t.Parallel()
	b := setup(t)
	sc := api(b.ts, testKey)
	piID := b.paid(t, "o1")
	b.srv.Inject(Fault{Kind: FaultDropResponse, Match: "POST /v1/refunds"})

	_, err := sc.Refunds.New(refundReq(piID, 700, "t:refund:o1:r1:stripe", "r1"))
	require.Error(t, err)
	var se *stripe.Error
	require.False(t, errors.As(err, &se), "want a transport error, got %v", err)
	require.Equal(t, 1, b.srv.Refunds(), "the refund happened")

	// After the lost response, keyed finds the refund by its metadata...
	it := sc.Refunds.List(&stripe.RefundListParams{PaymentIntent: stripe.String(piID)})
	require.True(t, it.Next())
	found := it.Refund()
	require.Equal(t, "t:refund:o1:r1:stripe", found.Metadata["effect_key"])

	// ...and a replay of the key returns the same refund.
	re, err := sc.Refunds.New(refundReq(piID, 700, "t:refund:o1:r1:stripe", "r1"))
	require.NoError(t, err)
	require.Equal(t, found.ID, re.ID)
	require.Equal(t, "true", re.LastResponse.Header.Get("Idempotent-Replayed"))
	require.Equal(t, 1, b.srv.RefundsForMetadata("effect_key", "t:refund:o1:r1:stripe"))
	require.EqualValues(t, 700, b.srv.RefundedAmount(piID))
}

func TestRefundFaults(t *testing.T) {
	t.Parallel()
	b := setup(t)
	sc := api(b.ts, testKey)
	b.srv.Inject(Fault{Kind: FaultServerError, Match: "POST /v1/refunds"})
	b.srv.Inject(Fault{Kind: FaultRateLimit, Match: "POST /v1/refunds"})

	// Faults aimed at refunds leave charges alone.
	piID := b.paid(t, "o1")
	require.Len(t, b.srv.pendingFaults(), 2)

	_, err := sc.Refunds.New(refundReq(piID, 0, "k1", "r1"))
	require.Equal(t, http.StatusInternalServerError, stripeErr(t, err).HTTPStatusCode)
	_, err = sc.Refunds.New(refundReq(piID, 0, "k1", "r1"))
	se := stripeErr(t, err)
	require.Equal(t, http.StatusTooManyRequests, se.HTTPStatusCode)
	require.Equal(t, stripe.ErrorCodeRateLimit, se.Code)
	require.Zero(t, b.srv.Refunds())

	// Neither was stored: the key now refunds.
	re, err := sc.Refunds.New(refundReq(piID, 0, "k1", "r1"))
	require.NoError(t, err)
	require.Empty(t, re.LastResponse.Header.Get("Idempotent-Replayed"))
	require.Equal(t, 1, b.srv.Refunds())
}

func TestResetForgetsRefunds(t *testing.T) {
	t.Parallel()
	b := setup(t)
	sc := api(b.ts, testKey)
	piID := b.paid(t, "o1")
	_, err := sc.Refunds.New(refundReq(piID, 0, "k1", "r1"))
	require.NoError(t, err)

	b.srv.Reset()
	require.Zero(t, b.srv.Refunds())
	require.Zero(t, b.srv.RefundedAmount(piID))
	require.Zero(t, b.srv.Stats().Refunds)
}

func TestLatestChargeShowsRefunds(t *testing.T) {
	t.Parallel()
	b := setup(t)
	sc := api(b.ts, testKey)
	piID := b.paid(t, "o1")
	expand := func() *stripe.Charge {
		t.Helper()
		p := &stripe.PaymentIntentParams{}
		p.AddExpand("latest_charge")
		pi, err := sc.PaymentIntents.Get(piID, p)
		require.NoError(t, err)
		require.Equal(t, stripe.PaymentIntentStatusSucceeded, pi.Status)
		require.EqualValues(t, 1999, pi.AmountReceived)
		return pi.LatestCharge
	}

	ch := expand()
	require.True(t, strings.HasPrefix(ch.ID, "ch_"))
	require.Equal(t, stripe.ChargeStatusSucceeded, ch.Status)
	require.True(t, ch.Paid)
	require.True(t, ch.Captured)
	require.EqualValues(t, 1999, ch.AmountCaptured)
	require.Zero(t, ch.AmountRefunded)
	require.False(t, ch.Refunded)
	require.Equal(t, piID, ch.PaymentIntent.ID)

	_, err := sc.Refunds.New(refundReq(piID, 999, "k1", "r1"))
	require.NoError(t, err)
	ch = expand()
	require.EqualValues(t, 999, ch.AmountRefunded)
	require.False(t, ch.Refunded)

	_, err = sc.Refunds.New(refundReq(piID, 0, "k2", "r2"))
	require.NoError(t, err)
	ch = expand()
	require.EqualValues(t, 1999, ch.AmountRefunded)
	require.True(t, ch.Refunded)

	got, err := sc.Charges.Get(ch.ID, nil)
	require.NoError(t, err)
	require.EqualValues(t, 1999, got.AmountRefunded)
	require.True(t, got.Refunded)
	_, err = sc.Charges.Get("ch_missing", nil)
	require.Equal(t, stripe.ErrorCodeResourceMissing, stripeErr(t, err).Code)

	// Without expand, latest_charge stays an ID.
	pi, err := sc.PaymentIntents.Get(piID, nil)
	require.NoError(t, err)
	require.Equal(t, ch.ID, pi.LatestCharge.ID)
	require.Zero(t, pi.LatestCharge.AmountRefunded)
}

func TestDeclinedLatestCharge(t *testing.T) {
	t.Parallel()
	b := setup(t)
	sc := api(b.ts, testKey)
	_, err := b.pi.New(params("o1", "pm_card_chargeDeclined", "charge:o1"))
	se := stripeErr(t, err)
	ch, err := sc.Charges.Get(se.PaymentIntent.LatestCharge.ID, nil)
	require.NoError(t, err)
	require.Equal(t, stripe.ChargeStatusFailed, ch.Status)
	require.False(t, ch.Paid)
	require.Equal(t, "card_declined", ch.FailureCode)
}

func TestListRefundsFilters(t *testing.T) {
	t.Parallel()
	clk := newClock()
	b := setupWith(t, &Opts{Now: clk.Now})
	sc := api(b.ts, testKey)
	piID := b.paid(t, "o1")
	early, err := sc.Refunds.New(refundReq(piID, 100, "k1", "r1"))
	require.NoError(t, err)
	clk.Advance(time.Minute)
	late, err := sc.Refunds.New(refundReq(piID, 100, "k2", "r2"))
	require.NoError(t, err)

	ids := func(p *stripe.RefundListParams) []string {
		t.Helper()
		var out []string
		it := sc.Refunds.List(p)
		for it.Next() {
			out = append(out, it.Refund().ID)
		}
		require.NoError(t, it.Err())
		return out
	}
	require.Equal(t, []string{late.ID}, ids(&stripe.RefundListParams{CreatedRange: &stripe.RangeQueryParams{GreaterThan: early.Created}}))
	require.Equal(t, []string{early.ID}, ids(&stripe.RefundListParams{Created: stripe.Int64(early.Created)}))
	require.Equal(t, []string{late.ID, early.ID}, ids(&stripe.RefundListParams{Charge: stripe.String(early.Charge.ID)}))
	before := &stripe.RefundListParams{}
	before.EndingBefore = stripe.String(early.ID)
	require.Equal(t, []string{late.ID}, ids(before))

	h := http.Header{"Authorization": {"Bearer " + testKey}}
	status, body := b.do(t, http.MethodGet, "/v1/refunds?colour=red", "", h)
	require.Equal(t, http.StatusBadRequest, status)
	require.Contains(t, body, "parameter_unknown")
	status, body = b.do(t, http.MethodGet, "/v1/refunds?starting_after=re_missing", "", h)
	require.Equal(t, http.StatusBadRequest, status)
	require.Contains(t, body, "resource_missing")
}

func TestSearchExpandsLatestCharge(t *testing.T) {
	t.Parallel()
	b := setup(t)
	sc := api(b.ts, testKey)
	piID := b.paid(t, "o1")
	_, err := sc.Refunds.New(refundReq(piID, 500, "k1", "r1"))
	require.NoError(t, err)

	p := &stripe.PaymentIntentSearchParams{SearchParams: stripe.SearchParams{Query: "metadata['order_id']:'o1'"}}
	p.AddExpand("data.latest_charge")
	it := sc.PaymentIntents.Search(p)
	require.True(t, it.Next())
	require.Equal(t, piID, it.PaymentIntent().ID)
	require.EqualValues(t, 500, it.PaymentIntent().LatestCharge.AmountRefunded)
	require.False(t, it.Next())
	require.NoError(t, it.Err())
}

// TestHeldRefundIsListed shows the window a takeover meets: the refund has
// happened and is listed with its metadata while its response is held.
func TestHeldRefundIsListed(t *testing.T) {
	t.Parallel()
	b := setup(t)
	sc := api(b.ts, testKey)
	piID := b.paid(t, "o1")
	b.srv.Inject(Fault{Kind: FaultHoldResponse, Delay: 300 * time.Millisecond, Match: "POST /v1/refunds"})

	done := make(chan error, 1)
	go func() {
		_, err := sc.Refunds.New(refundReq(piID, 0, "t:refund:o1:r1", "r1"))
		done <- err
	}()
	require.Eventually(t, func() bool { return b.srv.Refunds() == 1 }, 2*time.Second, time.Millisecond)
	it := sc.Refunds.List(&stripe.RefundListParams{PaymentIntent: stripe.String(piID)})
	require.True(t, it.Next())
	require.Equal(t, "t:refund:o1:r1", it.Refund().Metadata["effect_key"])
	again, err := sc.Refunds.New(refundReq(piID, 0, "t:refund:o1:r1", "r1"))
	require.NoError(t, err)
	require.Equal(t, it.Refund().ID, again.ID)
	require.NoError(t, <-done)
	require.Equal(t, 1, b.srv.Refunds())
}

// TestRefundOutage: a rate fault of 1 aimed at refunds is an outage of the
// refund API only; charges go through, and Reset ends it.
func TestRefundOutage(t *testing.T) {
	t.Parallel()
	b := setup(t)
	sc := api(b.ts, testKey)
	b.srv.Inject(Fault{Kind: FaultServerError, Rate: 1, Match: "POST /v1/refunds"})
	piID := b.paid(t, "o1")
	for range 5 {
		_, err := sc.Refunds.New(refundReq(piID, 0, "k1", "r1"))
		require.Equal(t, http.StatusInternalServerError, stripeErr(t, err).HTTPStatusCode)
	}
	require.Zero(t, b.srv.Refunds())
	require.Len(t, b.srv.pendingFaults(), 1)
}
