package fakestripe

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/stripe/stripe-go/v76"
	"github.com/stripe/stripe-go/v76/paymentintent"
)

const testKey = "sk_test_fake_123456789"

type bundle struct {
	srv *Server
	ts  *httptest.Server
	pi  paymentintent.Client
}

func setup(t *testing.T) *bundle { return setupWith(t, nil) }

func setupWith(t *testing.T, opts *Opts) *bundle {
	t.Helper()
	srv := New(opts)
	ts := httptest.NewServer(srv)
	t.Cleanup(ts.Close)
	return &bundle{srv: srv, ts: ts, pi: client(ts, testKey)}
}

// client returns a stripe-go PaymentIntents client for ts, with its own
// connection pool and without network retries.
func client(ts *httptest.Server, key string) paymentintent.Client {
	b := stripe.GetBackendWithConfig(stripe.APIBackend, &stripe.BackendConfig{
		URL:               stripe.String(ts.URL),
		HTTPClient:        &http.Client{Transport: &http.Transport{}, Timeout: 10 * time.Second},
		MaxNetworkRetries: stripe.Int64(0),
		LeveledLogger:     &stripe.LeveledLogger{Level: stripe.LevelNull},
	})
	return paymentintent.Client{B: b, Key: key}
}

func params(orderID, pm, idemKey string) *stripe.PaymentIntentParams {
	p := &stripe.PaymentIntentParams{
		Amount:        stripe.Int64(1999),
		Currency:      stripe.String("usd"),
		PaymentMethod: stripe.String(pm),
		Confirm:       stripe.Bool(true),
		Description:   stripe.String("order " + orderID),
	}
	p.AddMetadata("order_id", orderID)
	if idemKey != "" {
		p.SetIdempotencyKey(idemKey)
	}
	return p
}

func stripeErr(t *testing.T, err error) *stripe.Error {
	t.Helper()
	var se *stripe.Error
	require.ErrorAs(t, err, &se)
	return se
}

// do sends a raw request and returns the status and body.
func (b *bundle) do(t *testing.T, method, path, body string, header http.Header) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, b.ts.URL+path, strings.NewReader(body))
	require.NoError(t, err)
	req.Header = header
	res, err := b.ts.Client().Do(req)
	require.NoError(t, err)
	defer res.Body.Close()
	out, err := io.ReadAll(res.Body)
	require.NoError(t, err)
	return res.StatusCode, string(out)
}

func (s *Server) inFlight(key string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for sc, e := range s.idem {
		if sc.key == key && !e.done {
			return true
		}
	}
	return false
}

func (s *Server) pendingFaults() []Fault { return s.faults.Pending() }

func TestCreateAndGet(t *testing.T) {
	t.Parallel()
	b := setup(t)

	pi, err := b.pi.New(params("o1", "pm_card_visa", "k1"))
	require.NoError(t, err)
	require.True(t, strings.HasPrefix(pi.ID, "pi_"))
	require.Equal(t, "payment_intent", pi.Object)
	require.Equal(t, stripe.PaymentIntentStatusSucceeded, pi.Status)
	require.EqualValues(t, 1999, pi.Amount)
	require.EqualValues(t, 1999, pi.AmountReceived)
	require.Equal(t, stripe.CurrencyUSD, pi.Currency)
	require.Equal(t, map[string]string{"order_id": "o1"}, pi.Metadata)
	require.Equal(t, "order o1", pi.Description)
	require.Equal(t, "pm_card_visa", pi.PaymentMethod.ID)
	require.True(t, strings.HasPrefix(pi.LatestCharge.ID, "ch_"))
	require.False(t, pi.Livemode)
	require.NotZero(t, pi.Created)
	require.Equal(t, "k1", pi.LastResponse.IdempotencyKey)
	require.True(t, strings.HasPrefix(pi.LastResponse.RequestID, "req_"))
	require.Empty(t, pi.LastResponse.Header.Get("Idempotent-Replayed"))

	got, err := b.pi.Get(pi.ID, nil)
	require.NoError(t, err)
	require.Equal(t, pi.ID, got.ID)
	require.Equal(t, pi.LatestCharge.ID, got.LatestCharge.ID)

	_, err = b.pi.Get("pi_missing", nil)
	se := stripeErr(t, err)
	require.Equal(t, http.StatusNotFound, se.HTTPStatusCode)
	require.Equal(t, stripe.ErrorCodeResourceMissing, se.Code)

	require.Equal(t, 1, b.srv.Charges())
	require.Equal(t, 1, b.srv.ChargesForKey("k1"))
	require.Equal(t, 1, b.srv.ChargesForMetadata("order_id", "o1"))
	require.Equal(t, 3, b.srv.Requests())
}

func TestUnconfirmedIsNotACharge(t *testing.T) {
	t.Parallel()
	b := setup(t)
	p := params("o1", "pm_card_visa", "")
	p.Confirm = nil
	pi, err := b.pi.New(p)
	require.NoError(t, err)
	require.Equal(t, stripe.PaymentIntentStatusRequiresConfirmation, pi.Status)
	require.Nil(t, pi.LatestCharge)
	require.Zero(t, b.srv.Charges())
}

func TestIdempotentReplay(t *testing.T) {
	t.Parallel()
	b := setup(t)

	first, err := b.pi.New(params("o1", "pm_card_visa", "key-1"))
	require.NoError(t, err)
	second, err := b.pi.New(params("o1", "pm_card_visa", "key-1"))
	require.NoError(t, err)

	require.Equal(t, first.ID, second.ID)
	require.Equal(t, first.LastResponse.RawJSON, second.LastResponse.RawJSON)
	require.Equal(t, "true", second.LastResponse.Header.Get("Idempotent-Replayed"))
	require.Equal(t, first.LastResponse.RequestID, second.LastResponse.Header.Get("Original-Request"))
	require.Equal(t, 1, b.srv.Charges())
	require.Equal(t, 1, b.srv.ChargesForKey("key-1"))
	require.Equal(t, 2, b.srv.Requests())
}

func TestIdempotencyParamsOrderInsensitive(t *testing.T) {
	t.Parallel()
	b := setup(t)
	h := http.Header{"Authorization": {"Bearer " + testKey}, "Idempotency-Key": {"k"},
		"Content-Type": {"application/x-www-form-urlencoded"}}

	status, body := b.do(t, "POST", "/v1/payment_intents", "amount=100&currency=usd&payment_method=pm_card_visa&confirm=true&metadata[a]=1&metadata[b]=2", h)
	require.Equal(t, http.StatusOK, status)
	status, replayed := b.do(t, "POST", "/v1/payment_intents", "metadata[b]=2&confirm=true&metadata[a]=1&currency=usd&amount=100&payment_method=pm_card_visa", h)
	require.Equal(t, http.StatusOK, status)
	require.Equal(t, body, replayed)
	require.Equal(t, 1, b.srv.Charges())
}

func TestIdempotencyParamMismatch(t *testing.T) {
	t.Parallel()
	b := setup(t)

	_, err := b.pi.New(params("o1", "pm_card_visa", "key-1"))
	require.NoError(t, err)
	p := params("o1", "pm_card_visa", "key-1")
	p.Amount = stripe.Int64(2000)
	_, err = b.pi.New(p)

	se := stripeErr(t, err)
	require.Equal(t, http.StatusBadRequest, se.HTTPStatusCode)
	require.Equal(t, stripe.ErrorTypeIdempotency, se.Type)
	require.Contains(t, se.Msg, "Try using a key other than 'key-1'")
	var ie *stripe.IdempotencyError
	require.ErrorAs(t, err, &ie)
	require.Equal(t, 1, b.srv.Charges())
}

func TestIdempotencyKeysScopedPerAPIKey(t *testing.T) {
	t.Parallel()
	b := setup(t)

	a, err := b.pi.New(params("o1", "pm_card_visa", "shared"))
	require.NoError(t, err)
	other, err := client(b.ts, "sk_test_other_account").New(params("o1", "pm_card_visa", "shared"))
	require.NoError(t, err)

	require.NotEqual(t, a.ID, other.ID)
	require.Equal(t, 2, b.srv.Charges())
	require.Equal(t, 2, b.srv.ChargesForKey("shared"))
}

func TestIdempotencyKeyExpires(t *testing.T) {
	t.Parallel()
	clk := newClock()
	b := setupWith(t, &Opts{Now: clk.Now})

	a, err := b.pi.New(params("o1", "pm_card_visa", "k"))
	require.NoError(t, err)
	clk.Advance(25 * time.Hour)
	c, err := b.pi.New(params("o1", "pm_card_visa", "k"))
	require.NoError(t, err)

	require.NotEqual(t, a.ID, c.ID)
	require.Equal(t, 2, b.srv.ChargesForKey("k"))
}

func TestInFlightConflict(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.srv.Inject(Fault{Kind: FaultLatency, Delay: 500 * time.Millisecond})

	type result struct {
		pi  *stripe.PaymentIntent
		err error
	}
	done := make(chan result)
	go func() {
		pi, err := b.pi.New(params("o1", "pm_card_visa", "slow"))
		done <- result{pi, err}
	}()
	require.Eventually(t, func() bool { return b.srv.inFlight("slow") }, 2*time.Second, time.Millisecond)

	_, err := b.pi.New(params("o1", "pm_card_visa", "slow"))
	se := stripeErr(t, err)
	require.Equal(t, http.StatusConflict, se.HTTPStatusCode)
	require.Equal(t, stripe.ErrorTypeInvalidRequest, se.Type)
	require.Equal(t, stripe.ErrorCodeIdempotencyKeyInUse, se.Code)

	r := <-done
	require.NoError(t, r.err)
	require.Equal(t, 1, b.srv.Charges())

	again, err := b.pi.New(params("o1", "pm_card_visa", "slow"))
	require.NoError(t, err)
	require.Equal(t, r.pi.ID, again.ID)
	require.Equal(t, 1, b.srv.Charges())
}

func TestDropResponse(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.srv.Inject(Fault{Kind: FaultDropResponse})

	// The first request runs on a fresh connection, so net/http does not
	// retry it and the caller sees the failure.
	_, err := b.pi.New(params("o1", "pm_card_visa", "drop-1"))
	require.Error(t, err)
	var se *stripe.Error
	require.False(t, errors.As(err, &se), "want a transport error, got %v", err)
	require.Equal(t, 1, b.srv.Charges())

	pi, err := b.pi.New(params("o1", "pm_card_visa", "drop-1"))
	require.NoError(t, err)
	require.Equal(t, "true", pi.LastResponse.Header.Get("Idempotent-Replayed"))
	require.Equal(t, stripe.PaymentIntentStatusSucceeded, pi.Status)
	require.Equal(t, 1, b.srv.Charges())
	require.Equal(t, 1, b.srv.ChargesForMetadata("order_id", "o1"))
}

// TestDropResponseOnReusedConnection documents that net/http itself resends
// a request that has an Idempotency-Key header when a kept-alive connection
// is closed without a response, so stripe-go callers never see the drop.
func TestDropResponseOnReusedConnection(t *testing.T) {
	t.Parallel()
	b := setup(t)
	_, err := b.pi.New(params("o0", "pm_card_visa", "warm-up"))
	require.NoError(t, err)

	b.srv.Inject(Fault{Kind: FaultDropResponse})
	pi, err := b.pi.New(params("o1", "pm_card_visa", "drop-1"))
	require.NoError(t, err)
	require.Equal(t, "true", pi.LastResponse.Header.Get("Idempotent-Replayed"))
	require.Equal(t, 1, b.srv.ChargesForKey("drop-1"))
	require.Equal(t, 3, b.srv.Requests())
}

func TestServerErrorIsNotStored(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.srv.Inject(Fault{Kind: FaultServerError})

	_, err := b.pi.New(params("o1", "pm_card_visa", "k"))
	se := stripeErr(t, err)
	require.Equal(t, http.StatusInternalServerError, se.HTTPStatusCode)
	require.Equal(t, stripe.ErrorTypeAPI, se.Type)
	require.Zero(t, b.srv.Charges())

	pi, err := b.pi.New(params("o1", "pm_card_visa", "k"))
	require.NoError(t, err)
	require.Empty(t, pi.LastResponse.Header.Get("Idempotent-Replayed"))
	require.Equal(t, 1, b.srv.Charges())
}

func TestRateLimit(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.srv.Inject(Fault{Kind: FaultRateLimit, Times: 2})

	for range 2 {
		_, err := b.pi.New(params("o1", "pm_card_visa", "k"))
		se := stripeErr(t, err)
		require.Equal(t, http.StatusTooManyRequests, se.HTTPStatusCode)
		require.Equal(t, stripe.ErrorCodeRateLimit, se.Code)
	}
	require.Zero(t, b.srv.Charges())
	_, err := b.pi.New(params("o1", "pm_card_visa", "k"))
	require.NoError(t, err)
	require.Equal(t, 1, b.srv.Charges())
}

// A rate fault stays queued and faults every matching request with its
// probability; here 1, so every request of the matched keys.
func TestRateFault(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.srv.Inject(Fault{Kind: FaultServerError, Rate: 1, Match: "rated-"})

	for _, key := range []string{"rated-1", "rated-2", "rated-1"} {
		_, err := b.pi.New(params("o1", "pm_card_visa", key))
		require.Equal(t, http.StatusInternalServerError, stripeErr(t, err).HTTPStatusCode)
	}
	_, err := b.pi.New(params("o2", "pm_card_visa", "plain"))
	require.NoError(t, err)
	require.Equal(t, 1, b.srv.Charges())
	require.Equal(t, []Fault{{Kind: FaultServerError, Rate: 1, Match: "rated-"}}, b.srv.pendingFaults())

	status, body := b.do(t, "POST", "/_fake/faults", `{"kind":"rate_limit","rate":1.5}`, nil)
	require.Equal(t, http.StatusBadRequest, status)
	require.Contains(t, body, "not within [0, 1]")
}

func TestFaultMatch(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.srv.Inject(Fault{Kind: FaultServerError, Match: "order-7"})

	_, err := b.pi.New(params("o1", "pm_card_visa", "charge:order-1"))
	require.NoError(t, err)
	_, err = b.pi.New(params("o7", "pm_card_visa", "charge:order-7"))
	require.Equal(t, http.StatusInternalServerError, stripeErr(t, err).HTTPStatusCode)
	_, err = b.pi.New(params("o7", "pm_card_visa", "charge:order-7"))
	require.NoError(t, err)
	require.Equal(t, 2, b.srv.Charges())
}

func TestDecline(t *testing.T) {
	t.Parallel()
	for pm, want := range map[string]stripe.DeclineCode{
		"pm_card_chargeDeclined":    stripe.DeclineCodeGenericDecline,
		"pm_card_insufficientFunds": stripe.DeclineCodeInsufficientFunds,
	} {
		t.Run(pm, func(t *testing.T) {
			t.Parallel()
			b := setup(t)

			_, err := b.pi.New(params("o1", pm, "k"))
			se := stripeErr(t, err)
			require.Equal(t, http.StatusPaymentRequired, se.HTTPStatusCode)
			require.Equal(t, stripe.ErrorTypeCard, se.Type)
			require.Equal(t, stripe.ErrorCodeCardDeclined, se.Code)
			require.Equal(t, want, se.DeclineCode)
			require.True(t, strings.HasPrefix(se.ChargeID, "ch_"))
			require.Equal(t, stripe.PaymentIntentStatusRequiresPaymentMethod, se.PaymentIntent.Status)
			require.Equal(t, want, se.PaymentIntent.LastPaymentError.DeclineCode)
			var ce *stripe.CardError
			require.ErrorAs(t, err, &ce)
			require.Equal(t, want, ce.DeclineCode)
			require.Zero(t, b.srv.Charges())

			// Declines are stored: the retry replays the same decline.
			_, err = b.pi.New(params("o1", pm, "k"))
			again := stripeErr(t, err)
			require.Equal(t, se.PaymentIntent.ID, again.PaymentIntent.ID)
			require.Equal(t, "true", again.LastResponse.Header.Get("Idempotent-Replayed"))
			require.Zero(t, b.srv.Charges())
			require.Zero(t, b.srv.ChargesForMetadata("order_id", "o1"))
		})
	}
}

func TestValidation(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct {
		mutate func(*stripe.PaymentIntentParams)
		param  string
	}{
		"zero amount":      {func(p *stripe.PaymentIntentParams) { p.Amount = stripe.Int64(0) }, "amount"},
		"negative amount":  {func(p *stripe.PaymentIntentParams) { p.Amount = stripe.Int64(-5) }, "amount"},
		"missing amount":   {func(p *stripe.PaymentIntentParams) { p.Amount = nil }, "amount"},
		"missing currency": {func(p *stripe.PaymentIntentParams) { p.Currency = nil }, "currency"},
		"bad currency":     {func(p *stripe.PaymentIntentParams) { p.Currency = stripe.String("dollars") }, "currency"},
		"unknown param":    {func(p *stripe.PaymentIntentParams) { p.AddExtra("colour", "red") }, "colour"},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			p := params("o1", "pm_card_visa", "k")
			tc.mutate(p)

			_, err := b.pi.New(p)
			se := stripeErr(t, err)
			require.Equal(t, http.StatusBadRequest, se.HTTPStatusCode)
			require.Equal(t, stripe.ErrorTypeInvalidRequest, se.Type)
			require.Equal(t, tc.param, se.Param)

			// Validation failures are not stored, so the key is still free.
			_, err = b.pi.New(params("o1", "pm_card_visa", "k"))
			require.NoError(t, err)
			require.Equal(t, 1, b.srv.Charges())
		})
	}
}

func TestAuth(t *testing.T) {
	t.Parallel()
	b := setup(t)

	status, body := b.do(t, "GET", "/v1/payment_intents/pi_x", "", http.Header{})
	require.Equal(t, http.StatusUnauthorized, status)
	require.Contains(t, body, `"type": "invalid_request_error"`)

	_, err := client(b.ts, "pk_test_publishable").New(params("o1", "pm_card_visa", ""))
	require.Equal(t, http.StatusUnauthorized, stripeErr(t, err).HTTPStatusCode)
	require.Zero(t, b.srv.Charges())

	restricted := setupWith(t, &Opts{APIKey: "sk_test_only"})
	_, err = restricted.pi.New(params("o1", "pm_card_visa", ""))
	require.Equal(t, http.StatusUnauthorized, stripeErr(t, err).HTTPStatusCode)
	_, err = client(restricted.ts, "sk_test_only").New(params("o1", "pm_card_visa", ""))
	require.NoError(t, err)
}

func TestSearch(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ok1, err := b.pi.New(params("A", "pm_card_visa", ""))
	require.NoError(t, err)
	_, err = b.pi.New(params("A", "pm_card_chargeDeclined", ""))
	require.Error(t, err)
	okB, err := b.pi.New(params("B", "pm_card_visa", ""))
	require.NoError(t, err)

	search := func(q string, limit int64) []string {
		t.Helper()
		sp := &stripe.PaymentIntentSearchParams{SearchParams: stripe.SearchParams{Query: q, Limit: stripe.Int64(limit)}}
		it := b.pi.Search(sp)
		var ids []string
		for it.Next() {
			ids = append(ids, it.PaymentIntent().ID)
		}
		require.NoError(t, it.Err())
		return ids
	}

	require.Len(t, search(`metadata['order_id']:'A'`, 10), 2)
	require.Equal(t, []string{ok1.ID}, search(`metadata['order_id']:'A' AND status:'succeeded'`, 10))
	require.Equal(t, []string{ok1.ID}, search(`metadata["order_id"]:"A" AND -status:"requires_payment_method" AND amount>=1999`, 10))
	require.Equal(t, []string{okB.ID, ok1.ID}, search(`status:'succeeded' OR metadata['order_id']:'B'`, 1))
	require.Empty(t, search(`metadata['order_id']:'C'`, 10))

	status, body := b.do(t, "GET", "/v1/payment_intents/search?query=metadata%5B%27order_id%27%5D%3A%27B%27",
		"", http.Header{"Authorization": {"Bearer " + testKey}})
	require.Equal(t, http.StatusOK, status)
	require.Contains(t, body, `"object": "search_result"`)
	require.Contains(t, body, `"has_more": false`)
	require.Contains(t, body, okB.ID)

	it := b.pi.Search(&stripe.PaymentIntentSearchParams{SearchParams: stripe.SearchParams{Query: `status:'a' OR amount:1 AND currency:'usd'`}})
	require.False(t, it.Next())
	require.Equal(t, http.StatusBadRequest, stripeErr(t, it.Err()).HTTPStatusCode)
}

func TestSearchLag(t *testing.T) {
	t.Parallel()
	clk := newClock()
	b := setupWith(t, &Opts{Now: clk.Now, SearchLag: time.Minute})
	_, err := b.pi.New(params("A", "pm_card_visa", ""))
	require.NoError(t, err)

	count := func() int {
		it := b.pi.Search(&stripe.PaymentIntentSearchParams{SearchParams: stripe.SearchParams{Query: `metadata['order_id']:'A'`}})
		n := 0
		for it.Next() {
			n++
		}
		require.NoError(t, it.Err())
		return n
	}
	require.Zero(t, count())
	clk.Advance(2 * time.Minute)
	require.Equal(t, 1, count())
}

func TestAdminEndpoints(t *testing.T) {
	t.Parallel()
	b := setup(t)
	jsonHdr := http.Header{"Content-Type": {"application/json"}}

	status, _ := b.do(t, "POST", "/_fake/faults", `{"kind":"server_error","times":2,"match":"x"}`, jsonHdr)
	require.Equal(t, http.StatusNoContent, status)
	status, _ = b.do(t, "POST", "/_fake/faults", `{"kind":"latency","delay":"5ms"}`, jsonHdr)
	require.Equal(t, http.StatusNoContent, status)
	status, _ = b.do(t, "POST", "/_fake/faults", `{"kind":"explode"}`, jsonHdr)
	require.Equal(t, http.StatusBadRequest, status)
	require.Equal(t, []Fault{{Kind: FaultServerError, Times: 2, Match: "x"}, {Kind: FaultLatency, Times: 1, Delay: 5 * time.Millisecond}}, b.srv.pendingFaults())

	for range 2 {
		_, err := b.pi.New(params("o1", "pm_card_visa", "x1"))
		require.Equal(t, http.StatusInternalServerError, stripeErr(t, err).HTTPStatusCode)
	}
	_, err := b.pi.New(params("o1", "pm_card_visa", "x1"))
	require.NoError(t, err)

	status, body := b.do(t, "GET", "/_fake/stats", "", nil)
	require.Equal(t, http.StatusOK, status)
	require.JSONEq(t, `{"charges":1,"requests":3,"by_key":{"x1":1},"payment_intents":1,"refunds":0}`, body)

	status, _ = b.do(t, "POST", "/_fake/reset", "", nil)
	require.Equal(t, http.StatusNoContent, status)
	require.Equal(t, Stats{ByKey: map[string]int{}}, b.srv.Stats())
	require.Empty(t, b.srv.pendingFaults())
}

func TestAdminFaultHoldResponse(t *testing.T) {
	t.Parallel()
	b := setup(t)
	status, _ := b.do(t, "POST", "/_fake/faults", `{"kind":"hold_response","delay":"1ms"}`, http.Header{"Content-Type": {"application/json"}})
	require.Equal(t, http.StatusNoContent, status)
	require.Equal(t, []Fault{{Kind: FaultHoldResponse, Times: 1, Delay: time.Millisecond}}, b.srv.pendingFaults())
}

func TestConcurrentSameKey(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.srv.Inject(Fault{Kind: FaultLatency, Delay: 20 * time.Millisecond, Times: 5})

	var wg sync.WaitGroup
	ids := make(chan string, 40)
	for i := range 40 {
		wg.Go(func() {
			key := fmt.Sprintf("key-%d", i%4)
			pi, err := b.pi.New(params(key, "pm_card_visa", key))
			var se *stripe.Error
			switch {
			case err == nil:
				ids <- key + "=" + pi.ID
			case errors.As(err, &se) && se.Code == stripe.ErrorCodeIdempotencyKeyInUse:
			default:
				t.Errorf("unexpected error: %v", err)
			}
		})
	}
	wg.Wait()
	close(ids)

	perKey := map[string]string{}
	for kv := range ids {
		k, id, _ := strings.Cut(kv, "=")
		if prev, ok := perKey[k]; ok {
			require.Equal(t, prev, id)
		}
		perKey[k] = id
	}
	require.Equal(t, 4, b.srv.Charges())
	for i := range 4 {
		require.Equal(t, 1, b.srv.ChargesForKey(fmt.Sprintf("key-%d", i)))
	}
	require.Equal(t, 40, b.srv.Requests())
}

// clock is a settable time source for Opts.Now.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func newClock() *clock { return &clock{now: time.Unix(1_700_000_000, 0)} }

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// An outage answers every request, reads included, 503 api_error and
// performs nothing, until it ends.
func TestOutageAnswersEveryRequest503(t *testing.T) {
	t.Parallel()
	b := setup(t)
	pi, err := b.pi.New(params("o1", "pm_card_visa", "k1"))
	require.NoError(t, err)
	b.srv.SetOutage(true)
	_, err = b.pi.Get(pi.ID, nil)
	se := stripeErr(t, err)
	require.Equal(t, http.StatusServiceUnavailable, se.HTTPStatusCode)
	require.Equal(t, stripe.ErrorTypeAPI, se.Type)
	_, err = b.pi.New(params("o2", "pm_card_visa", "k2"))
	require.Equal(t, http.StatusServiceUnavailable, stripeErr(t, err).HTTPStatusCode)
	require.Equal(t, 1, b.srv.Charges(), "nothing performed during the outage")
	b.srv.SetOutage(false)
	got, err := b.pi.Get(pi.ID, nil)
	require.NoError(t, err)
	require.Equal(t, pi.ID, got.ID)
}
