package fakestripe

import (
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
)

// refund is the JSON shape of a Stripe Refund. Like paymentIntent, it is
// never mutated once stored.
type refund struct {
	ID                     string            `json:"id"`
	Object                 string            `json:"object"`
	Amount                 int64             `json:"amount"`
	BalanceTransaction     string            `json:"balance_transaction"`
	Charge                 string            `json:"charge"`
	Created                int64             `json:"created"`
	Currency               string            `json:"currency"`
	Metadata               map[string]string `json:"metadata"`
	PaymentIntent          string            `json:"payment_intent"`
	Reason                 *string           `json:"reason"`
	ReceiptNumber          *string           `json:"receipt_number"`
	SourceTransferReversal *string           `json:"source_transfer_reversal"`
	Status                 string            `json:"status"`
	TransferReversal       *string           `json:"transfer_reversal"`

	idemKey string
}

// refundParams are the Refund create parameters; Stripe rejects any other.
var refundParams = map[string]bool{}

// refundReasons are the reasons a caller may give a refund.
var refundReasons = []string{"duplicate", "fraudulent", "requested_by_customer"}

func init() {
	for _, p := range strings.Fields(`amount charge currency customer expand instructions_email metadata origin
		payment_intent reason refund_application_fee reverse_transfer`) {
		refundParams[p] = true
	}
}

// Refunds returns the number of refunds actually created. Idempotent
// replays and refused refunds are not counted.
func (s *Server) Refunds() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.refunds)
}

// RefundsForKey returns the number of refunds created by requests carrying
// the Idempotency-Key idemKey (under any API key).
func (s *Server) RefundsForKey(idemKey string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, re := range s.refunds {
		if idemKey != "" && re.idemKey == idemKey {
			n++
		}
	}
	return n
}

// RefundsForMetadata returns the number of refunds whose metadata has key
// set to value.
func (s *Server) RefundsForMetadata(key, value string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, re := range s.refunds {
		if v, ok := re.Metadata[key]; ok && v == value {
			n++
		}
	}
	return n
}

// RefundedAmount returns the sum of the refunds of the payment intent
// paymentIntentID, 0 if it has none or does not exist.
func (s *Server) RefundedAmount(paymentIntentID string) int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.refunded[paymentIntentID]
}

// createRefund is the executor of POST /v1/refunds. Like Stripe, it stores
// refusals that depend on the payment's state (nothing left to refund, an
// amount above what is left, a payment without a successful charge) for
// idempotent replays, but not invalid or unknown parameters.
func (s *Server) createRefund(p url.Values, idemKey string) (any, int, *apiError, bool) {
	meta, apiErr := parseParams(p, refundParams)
	if apiErr != nil {
		return nil, http.StatusBadRequest, apiErr, false
	}
	amount, apiErr := refundAmount(p)
	if apiErr == nil {
		apiErr = checkReason(p.Get("reason"))
	}
	if apiErr != nil {
		return nil, http.StatusBadRequest, apiErr, false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	pi, apiErr := s.refundTarget(p.Get("payment_intent"), p.Get("charge"))
	if apiErr != nil {
		return nil, http.StatusBadRequest, apiErr, false
	}
	re, apiErr := s.refundLocked(pi, amount, p.Get("reason"), meta, idemKey)
	if apiErr != nil {
		return nil, http.StatusBadRequest, apiErr, true
	}
	return re, http.StatusOK, nil, true
}

// refundAmount returns the amount parameter, or 0 if it is absent.
func refundAmount(p url.Values) (int64, *apiError) {
	if !p.Has("amount") {
		return 0, nil
	}
	amount, err := strconv.ParseInt(p.Get("amount"), 10, 64)
	if err != nil {
		return 0, &apiError{Type: "invalid_request_error", Param: "amount", Code: "parameter_invalid_integer",
			Message: "Invalid integer: " + p.Get("amount")}
	}
	if amount < 1 {
		return 0, &apiError{Type: "invalid_request_error", Param: "amount", Code: "parameter_invalid_integer",
			Message: "This value must be greater than or equal to 1."}
	}
	return amount, nil
}

// checkReason refuses a reason other than Stripe's.
func checkReason(reason string) *apiError {
	if reason == "" || slices.Contains(refundReasons, reason) {
		return nil
	}
	return &apiError{Type: "invalid_request_error", Param: "reason",
		Message: "Invalid reason: must be one of duplicate, fraudulent, or requested_by_customer"}
}

// refundTarget returns the payment intent named by piID, or else the one
// whose latest charge is chargeID. s.mu must be held.
func (s *Server) refundTarget(piID, chargeID string) (*paymentIntent, *apiError) {
	missing := func(param, what, id string) (*paymentIntent, *apiError) {
		return nil, &apiError{Type: "invalid_request_error", Code: "resource_missing", Param: param,
			Message: fmt.Sprintf("No such %s: '%s'", what, id)}
	}
	switch {
	case piID != "":
		pi := s.intents[piID]
		if pi == nil {
			return missing("payment_intent", "payment_intent", piID)
		}
		if chargeID != "" && (pi.LatestCharge == nil || *pi.LatestCharge != chargeID) {
			return nil, &apiError{Type: "invalid_request_error", Param: "charge",
				Message: fmt.Sprintf("The charge %s does not belong to the PaymentIntent %s.", chargeID, piID)}
		}
		return pi, nil
	case chargeID != "":
		for _, pi := range s.ordered {
			if pi.LatestCharge != nil && *pi.LatestCharge == chargeID {
				return pi, nil
			}
		}
		return missing("charge", "charge", chargeID)
	}
	return nil, &apiError{Type: "invalid_request_error", Code: "parameter_missing", Param: "charge",
		Message: "Missing required param: charge."}
}

// refundLocked refunds amount (0: all that is left) of pi's charge, or
// refuses as Stripe does. s.mu must be held.
func (s *Server) refundLocked(pi *paymentIntent, amount int64, reason string, meta map[string]string, idemKey string) (*refund, *apiError) {
	if pi.Status != "succeeded" {
		return nil, &apiError{Type: "invalid_request_error", Code: "payment_intent_unexpected_state", Param: "payment_intent",
			Message: fmt.Sprintf("This PaymentIntent (%s) does not have a successful charge to refund.", pi.ID)}
	}
	left := pi.AmountReceived - s.refunded[pi.ID]
	if left <= 0 {
		return nil, &apiError{Type: "invalid_request_error", Code: "charge_already_refunded",
			Message: fmt.Sprintf("Charge %s has already been refunded.", *pi.LatestCharge)}
	}
	if amount == 0 {
		amount = left
	}
	if amount > left {
		return nil, &apiError{Type: "invalid_request_error", Code: "amount_too_large", Param: "amount",
			Message: fmt.Sprintf("Refund amount (%s) is greater than unrefunded amount on charge (%s)",
				money(amount, pi.Currency), money(left, pi.Currency))}
	}
	re := &refund{
		ID: newID("re_"), Object: "refund", Amount: amount, BalanceTransaction: newID("txn_"),
		Charge: *pi.LatestCharge, Created: s.opts.Now().Unix(), Currency: pi.Currency, Metadata: meta,
		PaymentIntent: pi.ID, Reason: opt(reason), Status: "succeeded", idemKey: idemKey,
	}
	s.refunds = append(s.refunds, re)
	s.refundsByID[re.ID] = re
	s.refunded[pi.ID] += amount
	return re, nil
}

// money renders amount minor units of currency as Stripe's messages do.
func money(amount int64, currency string) string {
	v := fmt.Sprintf("%d.%02d", amount/100, amount%100)
	if currency == "usd" {
		return "$" + v
	}
	return v + " " + strings.ToUpper(currency)
}

func (s *Server) getRefund(w http.ResponseWriter, r *http.Request, _ string) {
	id := r.PathValue("id")
	s.mu.Lock()
	re := s.refundsByID[id]
	s.mu.Unlock()
	if re == nil {
		writeError(w, http.StatusNotFound, &apiError{Type: "invalid_request_error", Code: "resource_missing", Param: "id",
			Message: fmt.Sprintf("No such refund: '%s'", id)})
		return
	}
	writeJSON(w, http.StatusOK, re)
}
