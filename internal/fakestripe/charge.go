package fakestripe

import (
	"fmt"
	"net/http"
	"net/url"
	"strings"
)

// charge is the JSON shape of a Stripe Charge: the latest charge of a
// payment intent, with the refunds made so far. It is rendered on demand,
// never stored.
type charge struct {
	ID             string            `json:"id"`
	Object         string            `json:"object"`
	Amount         int64             `json:"amount"`
	AmountCaptured int64             `json:"amount_captured"`
	AmountRefunded int64             `json:"amount_refunded"`
	Captured       bool              `json:"captured"`
	Created        int64             `json:"created"`
	Currency       string            `json:"currency"`
	FailureCode    *string           `json:"failure_code"`
	FailureMessage *string           `json:"failure_message"`
	Livemode       bool              `json:"livemode"`
	Metadata       map[string]string `json:"metadata"`
	Paid           bool              `json:"paid"`
	PaymentIntent  string            `json:"payment_intent"`
	PaymentMethod  *string           `json:"payment_method"`
	Refunded       bool              `json:"refunded"`
	Status         string            `json:"status"`
}

// expandedIntent renders a payment intent with its latest charge expanded,
// as for expand[]=latest_charge.
type expandedIntent struct {
	*paymentIntent
	LatestCharge *charge `json:"latest_charge"`
}

// chargeOf returns pi's latest charge, or nil if it has none. s.mu must be
// held.
func (s *Server) chargeOf(pi *paymentIntent) *charge {
	if pi.LatestCharge == nil {
		return nil
	}
	ch := &charge{
		ID: *pi.LatestCharge, Object: "charge", Amount: pi.Amount, Created: pi.Created, Currency: pi.Currency,
		Metadata: pi.Metadata, PaymentIntent: pi.ID, PaymentMethod: pi.PaymentMethod, Status: "succeeded", Paid: true,
	}
	switch {
	case !pi.charged:
		ch.Status, ch.Paid = "failed", false
		if e := pi.LastPaymentError; e != nil {
			ch.FailureCode, ch.FailureMessage = opt(e.Code), opt(e.Message)
		}
	case pi.Status == "succeeded":
		ch.Captured, ch.AmountCaptured = true, pi.AmountReceived
		ch.AmountRefunded = s.refunded[pi.ID]
		ch.Refunded = ch.AmountRefunded >= ch.AmountCaptured
	}
	return ch
}

// render returns pi as served: with its latest charge expanded if expand
// asks for it.
func (s *Server) render(pi *paymentIntent, expand []string) any {
	for _, e := range expand {
		if e == "latest_charge" {
			s.mu.Lock()
			defer s.mu.Unlock()
			return expandedIntent{paymentIntent: pi, LatestCharge: s.chargeOf(pi)}
		}
	}
	return pi
}

// expansions returns the values of the expand, expand[] and expand[N]
// parameters of q.
func expansions(q url.Values) []string {
	var out []string
	for k, vs := range q {
		if k == "expand" || strings.HasPrefix(k, "expand[") {
			out = append(out, vs...)
		}
	}
	return out
}

// getCharge serves GET /v1/charges/{id}: the latest charge of a payment
// intent.
func (s *Server) getCharge(w http.ResponseWriter, r *http.Request, _ string) {
	id := r.PathValue("id")
	s.mu.Lock()
	var ch *charge
	for _, pi := range s.ordered {
		if pi.LatestCharge != nil && *pi.LatestCharge == id {
			ch = s.chargeOf(pi)
			break
		}
	}
	s.mu.Unlock()
	if ch == nil {
		writeError(w, http.StatusNotFound, &apiError{Type: "invalid_request_error", Code: "resource_missing", Param: "id",
			Message: fmt.Sprintf("No such charge: '%s'", id)})
		return
	}
	writeJSON(w, http.StatusOK, ch)
}
